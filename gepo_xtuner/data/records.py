"""The prompt-record schema shared by training, validation, evaluation and ``check_data``.

One record is one prompt, a JSON object (a JSONL line or a Parquet row):

================  ===========================  =============================================
field             type                         meaning
================  ===========================  =============================================
``prompt``        non-empty str                the prompt text (``prompt_template`` applies)
``messages``      list of ``{role, content}``  chat turns instead of ``prompt``, rendered with
                                               the tokenizer's chat template
``domain``        non-empty str                routes the reward (``rewards[domain]``)
``data_source``   str, optional                benchmark name; defaults to ``domain``
``images``        list of str, optional        image paths or URLs; relative paths are read
                                               from the data file's directory
``answer``        str, number or list          reference answer (math, numeric, choice, chart)
``choices``       list or ``{letter: text}``   multiple-choice options
``unit``          str, optional                unit of a bare-number ``answer``
``tests``         non-empty list of dicts      code tests (stdin/stdout or calls)
``test_list``     non-empty list of str        code: MBPP's assert strings (with
                                               ``test_setup_code`` / ``test_imports``)
``test``          str                          code: HumanEval's test (defines
                                               ``check(candidate)``), with
                                               ``entry_point``
``instructions``  non-empty list of dicts      ``{"id": ..., "kwargs": {...}}`` constraints;
                                               IFEval / IFBench as published give them as
                                               ``instruction_id_list`` + ``kwargs``
``id``            str or int, optional         default ``<file stem>-<line>`` (Parquet:
                                               ``<file stem>-<row>``); ints become strings
``metadata``      dict, optional               free-form; passed to the reward function
                                               (a JSON string holding an object, as LiveCodeBench
                                               publishes it, is accepted too)
================  ===========================  =============================================

Exactly one of ``prompt`` and ``messages`` is required. Other fields are kept and passed
to the reward function untouched. A top-level ``null`` counts as an absent field (that
is how a Parquet column stores "no value"). See ``docs/data.md``.

This module needs only the standard library (``datasets`` is imported for Parquet
files only), so ``tools/check_data.py`` loads it without importing torch.
"""

import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

#: Schemes that mark an image as remote (not checked on disk).
URL_SCHEMES = ('http://', 'https://', 'data:', 's3://', 'gs://', 'oss://')
#: Chat roles a ``messages`` turn may take.
ROLES = ('system', 'user', 'assistant', 'tool')
#: Fields with a documented meaning (anything else is kept as is).
KNOWN_FIELDS = ('prompt', 'messages', 'domain', 'data_source', 'images', 'answer', 'choices',
                'unit', 'tests', 'test_list', 'test_setup_code', 'test_imports',
                'challenge_test_list', 'test', 'entry_point', 'instructions', 'id', 'metadata')
PARQUET_SUFFIXES = ('.parquet', '.pq')


class DataFormatError(ValueError):
    """A dataset file is unusable; the message starts with ``FILE:LINE:`` (``FILE:row N:``)."""


def is_url(path: str) -> bool:
    """Whether an image reference is remote (a URL or data URI) rather than a local file."""
    return path.startswith(URL_SCHEMES)


def _fail(where: str, field: str, reason: str, fix: str) -> DataFormatError:
    return DataFormatError(f"{where}: field '{field}': {reason}; {fix}")


class _Problems:
    """A record's problems, collected so that one error names all of them.

    Each problem is one line ``FILE:LINE: field 'X': reason; fix``; a field read from
    another source field (``fields=``) names that source too.
    """

    def __init__(self, where: str, sources: Mapping[str, str]) -> None:
        self.where = where
        self.sources = sources
        self.lines: list[str] = []

    def add(self, field: str, reason: str, fix: str) -> None:
        top = re.split(r'[.\[]', field, maxsplit=1)[0]
        source = self.sources.get(top)
        label = f"'{field}'" + (f" (from the source field '{source}')"
                                if source is not None and source != top else '')
        self.lines.append(f'{self.where}: field {label}: {reason}; {fix}')

    def raise_if_any(self) -> None:
        if self.lines:
            raise DataFormatError('\n'.join(self.lines))


def _type(value: Any) -> str:
    return 'null' if value is None else type(value).__name__


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_text(record: dict, p: _Problems) -> None:
    has_prompt, has_messages = 'prompt' in record, 'messages' in record
    if has_prompt and has_messages:
        return p.add('messages', 'the record has both "prompt" and "messages"',
                     'keep one: "prompt" for plain text, "messages" for chat turns')
    if not has_prompt and not has_messages:
        return p.add('prompt', 'missing', 'give the text as "prompt": "..." or chat turns as '
                     '"messages": [{"role": "user", "content": "..."}] (another name: map it '
                     "with the dataset's fields=dict(prompt='question'))")
    if has_prompt:
        prompt = record['prompt']
        if not isinstance(prompt, str) or not prompt.strip():
            p.add('prompt', f'must be a non-empty string, got {prompt!r}',
                  'put the prompt text there')
        return None
    messages = record['messages']
    if not isinstance(messages, list) or not messages:
        return p.add('messages', f'must be a non-empty list of turns, got {_type(messages)}',
                     'write [{"role": "user", "content": "..."}]')
    for i, turn in enumerate(messages):
        at = f'messages[{i}]'
        if not isinstance(turn, dict):
            p.add(at, f'must be an object, got {_type(turn)}',
                  'write {"role": "user", "content": "..."}')
            continue
        if turn.get('role') not in ROLES:
            p.add(f'{at}.role', f'must be one of {list(ROLES)}, got {turn.get("role")!r}',
                  'name who speaks in each turn')
        content = turn.get('content')
        if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
            for j, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get('type'), str):
                    p.add(f'{at}.content[{j}]', 'a content part must be an object with a '
                          f'"type", got {part!r}',
                          'write {"type": "text", "text": "..."} or {"type": "image"}')
        elif not isinstance(content, str):
            p.add(f'{at}.content', f'must be a string or a list of content parts, got '
                  f'{_type(content)}', 'put the turn\'s text there')
    if isinstance(messages[-1], dict) and messages[-1].get('role') == 'assistant':
        p.add('messages', 'the last turn is the assistant\'s',
              'end with the turn the policy answers (user or tool); the policy writes the '
              'assistant turn')
    return None


def _check_images(record: dict, p: _Problems, base_dir: Path | None, check_files: bool
                  ) -> None:
    images = record['images']
    if not isinstance(images, list):
        return p.add('images', f'must be a list of paths or URLs, got {_type(images)}',
                     'write ["figure.png"] even for one image')
    resolved = []
    for i, image in enumerate(images):
        if not isinstance(image, str) or not image:
            p.add(f'images[{i}]', f'must be a path or URL string, got {_type(image)}',
                  'save embedded images as files and list their paths')
            continue
        if not is_url(image) and not os.path.isabs(image) and base_dir is not None:
            image = os.path.normpath(base_dir / image)  # relative to the data file
        if check_files and not is_url(image) and not os.path.isfile(image):
            p.add(f'images[{i}]', f'file {image} does not exist',
                  'fix the path (relative paths are read from the data file\'s directory) or '
                  'remove the image')
        resolved.append(image)
    record['images'] = resolved
    return None


def _check_references(record: dict, p: _Problems) -> None:
    if 'answer' in record:
        answer = record['answer']
        ok = isinstance(answer, str) or _is_number(answer) or (
            isinstance(answer, list) and answer
            and all(isinstance(a, str) or _is_number(a) for a in answer))
        if not ok:
            p.add('answer', f'must be a string, a number or a non-empty list of them, got '
                  f'{answer!r}', 'write the reference answer, e.g. "70"')
    if 'choices' in record:
        choices = record['choices']
        ok = (isinstance(choices, list) and choices
              and all(isinstance(c, str) or _is_number(c) for c in choices)) or (
            isinstance(choices, dict) and choices
            and all(isinstance(k, str) and isinstance(v, str) for k, v in choices.items()))
        if not ok:
            p.add('choices', f'must be a non-empty list of option texts (A, B, ... in order) '
                  f'or an object {{"A": "text", ...}}, got {choices!r}', 'list the options')
    if 'unit' in record and not isinstance(record['unit'], str):
        p.add('unit', f'must be a string, got {_type(record["unit"])}',
              'write the unit, e.g. "km"')
    if 'tests' in record:
        tests = record['tests']
        if isinstance(tests, list) and tests and all(isinstance(t, str) for t in tests):
            p.add('tests', 'is a list of strings (assert statements, as MBPP writes them)',
                  "name the field 'test_list', MBPP's own name, and they are run as asserts")
        elif not isinstance(tests, list) or not tests or not all(
                isinstance(t, dict) for t in tests):
            p.add('tests', f'must be a non-empty list of test objects, got {_type(tests)}',
                  'write [{"input": "...", "output": "..."}]')
    for name in ('test_list', 'challenge_test_list', 'test_imports'):
        if name in record and not (isinstance(record[name], list) and all(
                isinstance(t, str) for t in record[name])
                and (record[name] or name != 'test_list')):
            p.add(name, f'must be a {"non-empty " if name == "test_list" else ""}list of '
                  f'strings, got {_type(record[name])}',
                  'write MBPP\'s assert statements, e.g. ["assert f(1) == 2"]')
    if 'test' in record and 'entry_point' in record:
        if not isinstance(record['test'], str) or 'def check(' not in record['test']:
            p.add('test', "must be HumanEval's test program defining check(candidate)",
                  'copy the record\'s "test" field as published')
        if not isinstance(record['entry_point'], str) or not record['entry_point'].isidentifier():
            p.add('entry_point', f'must be a function name, got {record["entry_point"]!r}',
                  'write the name of the function the tests call')
    if 'instructions' in record:
        items = record['instructions']
        if not isinstance(items, list) or not items:
            p.add('instructions', f'must be a non-empty list, got {_type(items)}',
                  'write [{"id": "punctuation:no_comma", "kwargs": {}}]')
            items = []
        for i, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get('id'), str):
                p.add(f'instructions[{i}]', f'must be an object with a string "id", got '
                      f'{item!r}', 'write {"id": "...", "kwargs": {...}}')
            elif not isinstance(item.get('kwargs', {}), (dict, type(None))):
                p.add(f'instructions[{i}].kwargs', f'must be an object, got '
                      f'{_type(item["kwargs"])}', 'write the checker\'s arguments as {}')
    if 'instruction_id_list' in record:  # IFEval / IFBench as published
        _check_instruction_columns(record, p)
    if 'metadata' in record and not isinstance(record['metadata'], dict) \
            and not _json_object(record['metadata']):
        p.add('metadata', f'must be an object, got {_type(record["metadata"])}',
              'wrap the values in {...} (or, as LiveCodeBench publishes it, a JSON string '
              'holding an object)')


def _json_object(value: Any) -> bool:
    """Whether ``value`` is a string holding a JSON object (or nothing)."""
    if not isinstance(value, str):
        return False
    try:
        return not value.strip() or isinstance(json.loads(value), dict)
    except ValueError:
        return False


def _check_instruction_columns(record: dict, p: _Problems) -> None:
    ids, kwargs = record['instruction_id_list'], record.get('kwargs')
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        return p.add('instruction_id_list', f'must be a non-empty list of instruction ids, got '
                     f'{ids!r}', 'write ["punctuation:no_comma", ...] as IFEval does')
    if kwargs is None:
        return None
    if not isinstance(kwargs, list) or len(kwargs) != len(ids):
        got = f'{len(kwargs)} items' if isinstance(kwargs, list) else _type(kwargs)
        return p.add('kwargs', f'must be a list of {len(ids)} objects (one per instruction id), '
                     f'got {got}', 'write [{}, {"num_words": 300, "relation": "less than"}] '
                     'in the order of instruction_id_list')
    for i, item in enumerate(kwargs):
        if not isinstance(item, (dict, type(None))):
            p.add(f'kwargs[{i}]', f'must be an object, got {_type(item)}',
                  f'write the arguments of {ids[i]!r} as {{...}} ({{}} when it takes none)')
    return None


def check_field_map(fields: Mapping[str, str] | None) -> dict[str, str]:
    """Checks a dataset's ``fields`` mapping (record field <- source field) and copies it.

    Raises:
        ValueError: not a mapping of non-empty strings to non-empty strings.
    """
    if fields is None:
        return {}
    if not isinstance(fields, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in fields.items()):
        raise ValueError(f'fields must map record fields to source field names, e.g. '
                         f"dict(prompt='question', answer='answer'), got {fields!r}")
    return dict(fields)


def map_fields(record: dict[str, Any], fields: Mapping[str, str]) -> dict[str, Any]:
    """Renames a raw record's source fields to schema fields: ``fields[target] = source``.

    A mapped field is read from its source field only; the source field is removed
    unless it is itself a mapped field's name. Other fields are kept.

    >>> map_fields({'question': 'Q?', 'answer': '4', 'x': 1}, {'prompt': 'question'})
    {'answer': '4', 'x': 1, 'prompt': 'Q?'}
    """
    mapped = {target: record[source] for target, source in fields.items() if source in record}
    out = {k: v for k, v in record.items() if k not in fields and k not in fields.values()}
    out.update(mapped)
    return out


def validate_record(record: Any, where: str, *, base_dir: str | os.PathLike | None = None,
                    required: Sequence[str] = (), default_id: str | None = None,
                    check_images: bool = True, fields: Mapping[str, str] | None = None,
                    default_domain: str | None = None) -> dict[str, Any]:
    """Checks one record against the schema and returns its normalised copy.

    Normalisation: top-level ``null`` fields are dropped, source fields are renamed by
    ``fields``, ``domain`` defaults to ``default_domain``, ``id`` becomes a string
    (``default_id`` if absent), ``data_source`` defaults to ``domain``, relative image
    paths become paths under ``base_dir``.

    Args:
        record: the parsed JSON value (or Parquet row).
        where: ``'FILE:LINE'`` (or ``'FILE:row N'``), the prefix of every error.
        base_dir: directory that relative image paths are relative to.
        required: fields every record of this dataset must have (e.g. ``['answer']``).
        default_id: the ``id`` of a record without one.
        check_images: whether local image files must exist.
        fields: record field <- source field, for files whose columns have other names
            (GSM8K: ``dict(prompt='question')``); see :func:`map_fields`.
        default_domain: the ``domain`` of a record without one.

    Returns:
        A new dict; the input is not modified.

    Raises:
        DataFormatError: every problem of the record, one line each,
            ``'FILE:LINE: field X: reason; how to fix'``.
    """
    if not isinstance(record, dict):
        raise DataFormatError(f'{where}: expected a JSON object with "prompt" (or "messages") '
                              f'and "domain", got {_type(record)}')
    fields = fields or {}
    p = _Problems(where, fields)
    record = map_fields({k: v for k, v in record.items() if v is not None}, fields)
    if default_domain is not None:
        record.setdefault('domain', default_domain)
    _check_text(record, p)
    domain = record.get('domain')
    if not isinstance(domain, str) or not domain.strip():
        p.add('domain', 'missing' if domain is None else
              f'must be a non-empty string, got {domain!r}',
              'name the task family whose reward scores this record, e.g. "math" (for a '
              "file without domains: the dataset's default_domain='math')")
        domain = None
    source = record.setdefault('data_source', domain) if domain else record.get('data_source')
    if 'data_source' in record and (not isinstance(source, str) or not source.strip()):
        p.add('data_source', f'must be a non-empty string, got {source!r}',
              'name the benchmark, e.g. "aime2025", or drop the field')
    if 'images' in record:
        _check_images(record, p, None if base_dir is None else Path(base_dir), check_images)
    _check_references(record, p)
    if 'id' in record:
        rid = record['id']
        if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == '':
            p.add('id', f'must be a non-empty string or an integer, got {rid!r}',
                  'give each record a unique name, or drop the field')
        else:
            record['id'] = str(rid)
    elif default_id is not None:
        record['id'] = default_id
    for name in required:
        if name not in record:
            p.add(name, 'missing', f'this dataset requires {list(required)} in every record')
    p.raise_if_any()
    return record


def is_parquet(path: str | os.PathLike) -> bool:
    """Parquet by suffix; every other file is read as JSONL."""
    return Path(path).suffix.lower() in PARQUET_SUFFIXES


def _jsonl_rows(path: Path) -> Iterator[tuple[str, int, Any]]:
    with path.open('rb') as fh:  # bytes: a decoding error can then name its line
        for lineno, raw in enumerate(fh, start=1):
            where = f'{path}:{lineno}'
            try:
                text = raw.decode('utf-8')
            except UnicodeDecodeError as exc:
                raise DataFormatError(f'{where}: not UTF-8 text ({exc.reason} at byte '
                                      f'{exc.start} of the line); save the file as UTF-8'
                                      ) from None
            if lineno == 1:  # a UTF-8 byte order mark, as some Windows editors write
                text = text.removeprefix('\ufeff')
            if not text.strip():
                continue
            try:
                value = json.loads(text.rstrip('\r\n'))  # columns then stay on this line
            except json.JSONDecodeError as exc:
                raise DataFormatError(f'{where}: not valid JSON ({exc.msg} at column '
                                      f'{exc.colno}); each line must be one complete JSON '
                                      'object') from None
            yield where, lineno, value


def _parquet_rows(path: Path) -> Iterator[tuple[str, int, Any]]:
    import datasets  # only here: importing it costs seconds
    from datasets.utils import logging as ds_logging

    # quiet while reading: our own error replaces datasets' log lines and progress bars
    verbosity, bars_off = ds_logging.get_verbosity(), datasets.are_progress_bars_disabled()
    ds_logging.set_verbosity(ds_logging.CRITICAL)
    datasets.disable_progress_bars()
    try:
        table = datasets.Dataset.from_parquet(str(path), keep_in_memory=True)
    except Exception as exc:  # noqa: BLE001 (pyarrow raises many types for a bad file)
        raise DataFormatError(f'{path}: not a readable Parquet file ({type(exc).__name__}: '
                              f'{exc}); write it with pandas.DataFrame.to_parquet or '
                              'datasets.Dataset.to_parquet') from None
    finally:
        ds_logging.set_verbosity(verbosity)
        if not bars_off:
            datasets.enable_progress_bars()
    for row, value in enumerate(table.to_list()):
        yield f'{path}:row {row}', row, _drop_nulls(value)


def _drop_nulls(value: Any) -> Any:
    """Removes null-valued keys of (nested) objects; list items stay as they are.

    A Parquet column of objects has the union of all rows' keys, absent ones null
    (``{"num_words": 30}`` next to ``{"relation": "less than"}`` reads back as
    ``{"num_words": 30, "relation": None}``); dropping them restores what was written.
    """
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def read_rows(path: str | os.PathLike) -> Iterator[tuple[str, int, Any]]:
    """Raw rows of a file as ``(where, index, value)``, not yet validated.

    ``where`` is ``'FILE:LINE'`` (JSONL, 1-based line; blank lines skipped) or
    ``'FILE:row N'`` (Parquet, 0-based row); ``index`` is the line or row number.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DataFormatError: a line that is not UTF-8 or not JSON, an unreadable Parquet file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f'dataset file {path} does not exist')
    return _parquet_rows(path) if is_parquet(path) else _jsonl_rows(path)


def default_id(path: str | os.PathLike, index: int) -> str:
    """The ``id`` of a record without one: ``'<file stem>-<line or row>'``."""
    return f'{Path(path).stem}-{index}'


def iter_records(path: str | os.PathLike, *, required: Sequence[str] = (),
                 check_images: bool = True, unique_ids: bool = False,
                 fields: Mapping[str, str] | None = None, default_domain: str | None = None
                 ) -> Iterator[dict[str, Any]]:
    """Validated records of a JSONL or Parquet file, in file order.

    JSONL is parsed line by line with :mod:`json`, so every value keeps its JSON type
    and every error names its line (``datasets``' JSON loader infers one type per
    column: it turns ``"answer": "70"`` into ``70`` when another line has a number,
    and fills absent fields with ``null``). Parquet is read with ``datasets``; errors
    name the 0-based row. Blank JSONL lines are skipped.

    Args:
        path: ``.parquet``/``.pq`` file, or a JSONL file (any other name).
        required: fields every record must have.
        check_images: whether local image files must exist.
        unique_ids: reject a record whose ``id`` an earlier record has.
        fields: record field <- source field (see :func:`map_fields`).
        default_domain: the ``domain`` of records without one.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DataFormatError: the first bad line or row (all its problems), or an empty file.
        ValueError: ``fields`` is not a mapping of names.
    """
    path = Path(path)
    fields = check_field_map(fields)
    seen: dict[str, str] = {}
    count = 0
    for where, index, value in read_rows(path):
        record = validate_record(value, where, base_dir=path.absolute().parent,
                                 required=required, default_id=default_id(path, index),
                                 check_images=check_images, fields=fields,
                                 default_domain=default_domain)
        if unique_ids:
            first = seen.setdefault(record['id'], where)
            if first != where:
                raise _fail(where, 'id', f'{record["id"]!r} is already the id of {first}',
                            'ids must be unique within a file (evaluation resumes by id)')
        count += 1
        yield record
    if not count:
        raise DataFormatError(f'{path}:{"row 0" if is_parquet(path) else 1}: no records (the '
                              'file is empty)')


def load_records(path: str | os.PathLike, *, required: Sequence[str] = (),
                 check_images: bool = True, unique_ids: bool = False,
                 fields: Mapping[str, str] | None = None, default_domain: str | None = None
                 ) -> list[dict[str, Any]]:
    """All records of a file, see :func:`iter_records` (same arguments and errors)."""
    return list(iter_records(path, required=required, check_images=check_images,
                             unique_ids=unique_ids, fields=fields,
                             default_domain=default_domain))


def scan_file(path: str | os.PathLike, *, required: Sequence[str] = (),
              check_images: bool = True, fields: Mapping[str, str] | None = None,
              default_domain: str | None = None, limit: int = 20) -> tuple[int, list[str]]:
    """Checks every record of a file, going on past bad ones (for checkers).

    Args:
        path: the data file.
        required, check_images, fields, default_domain: as for :func:`iter_records`.
        limit: most problem lines returned; a last line counts the rest.

    Returns:
        ``(records read, problem lines)``, each line ``FILE:LINE: ...``; a file that
        cannot be read at all (missing, not JSON on some line, not Parquet) ends the
        scan with its error.
    """
    fields = check_field_map(fields)
    count, problems = 0, []
    try:
        for where, index, value in read_rows(path):
            count += 1
            try:
                validate_record(value, where, base_dir=Path(path).absolute().parent,
                                required=required, default_id=default_id(path, index),
                                check_images=check_images, fields=fields,
                                default_domain=default_domain)
            except DataFormatError as exc:
                problems += str(exc).splitlines()
    except (DataFormatError, FileNotFoundError) as exc:
        problems += str(exc).splitlines()
    if not count and not problems:
        problems.append(f'{path}:{"row 0" if is_parquet(path) else 1}: no records (the file '
                        'is empty)')
    if len(problems) > limit:
        problems = problems[:limit] + [f'{path}: ... and {len(problems) - limit} more problems']
    return count, problems
