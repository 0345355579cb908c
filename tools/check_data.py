#!/usr/bin/env python
"""Check prompt data files against the record schema before training or evaluation.

Usage::

    python tools/check_data.py FILE [FILE ...] [--required FIELD ...]
        [--fields FIELD=SOURCE ...] [--default-domain DOMAIN] [--allow-missing-images]
        [--model DIR]

Each file (JSONL; Parquet when it ends in ``.parquet``) is read and every record checked
against the schema of ``gepo_xtuner/data/records.py`` (see ``docs/data.md``). A bad file
is reported by its first bad record, in the form training would fail with::

    data/train.jsonl:17: field 'answer': must be a string, a number or ...; write ...

A good file gets a summary: records, counts per ``domain`` and ``data_source``, how many
records give each field, image files found (and URLs, which are not fetched), and a
warning for repeated ids (``tools/evaluate.py`` needs unique ids).

``--required answer`` makes a field mandatory, as ``PromptDataset(required=[...])`` does;
``--fields prompt=question`` and ``--default-domain math`` read files with other column
names, as ``PromptDataset(fields=dict(prompt='question'), default_domain='math')`` does.
``--allow-missing-images`` counts missing local image files instead of failing (for data
checked away from the machine that holds the images).

Every local image is decoded; one that does not decode fails the file. ``--model DIR``
(the policy's model, tokenizer or processor directory) also checks the records against
that policy: chat ``messages`` need its chat template, images at least its processor's
smallest side (Qwen2-VL: 28 px), and images above its ``max_pixels`` get a warning (they
are downscaled again on every draw). A UTF-8 byte order mark at the start of a JSONL
file is read as such.

Exit status: 0 if every file is good, 1 if any is not, 2 for a usage error.
"""

import argparse
import importlib.util
import os
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def data_modules() -> tuple[ModuleType, ModuleType]:
    """``gepo_xtuner/data/records.py`` and ``inputs.py``, without the package around them.

    They need only the standard library (and Pillow for images); importing them through
    the package would import torch, mmengine and transformers first (about 10 s here,
    against 0.1 s). They are loaded as the modules of a stand-in package whose path is
    ``gepo_xtuner/data``, so their relative imports work and ``__init__`` does not run.
    """
    folder = ROOT / 'gepo_xtuner' / 'data'
    if not (folder / 'inputs.py').is_file():  # a copy of the tool without the source tree
        from gepo_xtuner.data import inputs, records
        return records, inputs
    name = 'gepo_xtuner_data_files'
    if name not in sys.modules:
        package = ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    return (importlib.import_module(f'{name}.records'),
            importlib.import_module(f'{name}.inputs'))


def counts(counter: Counter, limit: int = 12) -> str:
    shown = ', '.join(f'{k} {v}' for k, v in counter.most_common(limit))
    more = len(counter) - limit
    return shown + (f', ... ({more} more)' if more > 0 else '')


def check_file(rec: ModuleType, path: Path, required: list[str], allow_missing: bool,
               fields: dict[str, str] | None = None, default_domain: str | None = None,
               inputs: Any = None) -> list[str]:
    """The report lines for one file; the first line says OK or names the first error.

    After the schema, every record is checked against the policy (``inputs``, a
    :class:`PolicyInputs`, or None: only that local images decode); those problems,
    all of them up to 20, fail the file, and its warnings end the report.
    """
    domains: Counter[str] = Counter()
    sources: Counter[str] = Counter()
    counted: Counter[str] = Counter()
    images = Counter()
    first_seen: dict[str, str] = {}
    repeated: list[str] = []
    total = 0
    checked = []
    for where, index, raw in rec.read_rows(path):
        record = rec.validate_record(raw, where, base_dir=path.absolute().parent,
                                     required=required, default_id=rec.default_id(path, index),
                                     check_images=not allow_missing, fields=fields,
                                     default_domain=default_domain)
        total += 1
        domains[record['domain']] += 1
        sources[record['data_source']] += 1
        counted.update(k for k in record if k in raw or k in (fields or {}))
        for image in record.get('images', ()):
            kind = 'URL' if rec.is_url(image) else (
                'found' if os.path.isfile(image) else 'missing')
            images[kind] += 1
        if record['id'] in first_seen:
            repeated.append(f'{record["id"]!r} at {where} (first at {first_seen[record["id"]]})')
        first_seen.setdefault(record['id'], where)
        checked.append((where, record))
    if not total:
        raise rec.DataFormatError(f'{path}:{"row 0" if rec.is_parquet(path) else 1}: no records '
                                  '(the file is empty)')
    problems, warnings = data_modules()[1].check_all(checked, inputs)
    if problems:
        raise rec.DataFormatError('\n'.join(problems))
    known = [f for f in rec.KNOWN_FIELDS if f in counted]
    other = sorted(set(counted) - set(rec.KNOWN_FIELDS))
    lines = [f'{path}: OK, {total} records',
             f'  domain        {counts(domains)}',
             f'  data_source   {counts(sources)}'
             + ('  (defaults to domain)' if 'data_source' not in counted else ''),
             '  fields        ' + ', '.join(f'{f} {counted[f]}' for f in known + other)]
    if images:
        parts = [f'found {images["found"]}']
        if images['missing']:
            parts.append(f'MISSING {images["missing"]}')
        if images['URL']:
            parts.append(f'URLs {images["URL"]} (not fetched)')
        lines.append('  images        ' + ', '.join(parts))
    if repeated:
        lines.append(f'  warning: {len(repeated)} repeated ids, e.g. {repeated[0]}; '
                     'tools/evaluate.py needs unique ids')
    lines += [f'  warning: {w}' for w in warnings]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('files', nargs='+', type=Path, metavar='FILE',
                        help='JSONL or Parquet data files')
    parser.add_argument('--required', nargs='+', default=[], metavar='FIELD',
                        help='fields every record must have (e.g. answer)')
    parser.add_argument('--fields', nargs='+', default=[], metavar='FIELD=SOURCE',
                        help='read a record field from a source field of another name, '
                             'e.g. prompt=question (as PromptDataset(fields=...))')
    parser.add_argument('--default-domain', metavar='DOMAIN',
                        help='domain of records without one (as PromptDataset(default_domain=))')
    parser.add_argument('--allow-missing-images', action='store_true',
                        help='count missing local image files instead of failing')
    parser.add_argument('--model', type=Path, metavar='DIR',
                        help="the policy's model (or tokenizer / processor) directory: chat "
                             'records need its chat template, images its processor\'s sizes')
    args = parser.parse_args(argv)
    if args.model is not None and not args.model.is_dir():
        parser.error(f'--model {args.model} is not a directory')
    bad = [f for f in args.fields if f.count('=') != 1 or '' in f.split('=')]
    if bad:
        parser.error(f'--fields takes FIELD=SOURCE pairs such as prompt=question, got {bad}')
    fields = dict(f.split('=') for f in args.fields)
    rec, inputs_module = data_modules()
    inputs = None if args.model is None else inputs_module.PolicyInputs.from_dir(args.model)
    failed = 0
    for path in args.files:
        try:
            print('\n'.join(check_file(rec, path, args.required, args.allow_missing_images,
                                        fields, args.default_domain, inputs)))
        except (rec.DataFormatError, FileNotFoundError) as exc:
            print(f'{exc}' if str(path) in str(exc) else f'{path}: {exc}')
            failed += 1
    if len(args.files) > 1:
        print(f'{len(args.files) - failed} of {len(args.files)} files OK')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
