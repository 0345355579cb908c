"""``tools/check_data.py`` as a user runs it: a real subprocess on good and broken files."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests import preloaded

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / 'tools' / 'check_data.py'

GOOD = [
    {'id': 'm1', 'domain': 'math', 'data_source': 'aime2025', 'prompt': 'Find x.',
     'answer': '70'},
    {'id': 'v1', 'domain': 'chart', 'data_source': 'chartqapro', 'answer': '57.9',
     'images': ['img/a.png', 'https://example.com/b.png'],
     'messages': [{'role': 'user', 'content': [{'type': 'image'},
                                               {'type': 'text', 'text': 'Value?'}]}]},
    {'id': 'c1', 'domain': 'code', 'prompt': 'Sum.',
     'tests': [{'input': '1 2\n', 'output': '3\n'}]},
    {'id': 'm2', 'domain': 'math', 'data_source': 'aime2025', 'prompt': 'Find y.',
     'answer': '3'},
]


def check(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS='1')
    return preloaded.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=120)


def jsonl(path: Path, rows: list) -> Path:
    path.write_text(''.join((r if isinstance(r, str) else json.dumps(r)) + '\n' for r in rows))
    return path


def png(path: Path, width: int = 64, height: int = 64) -> Path:
    from PIL import Image
    Image.new('RGB', (width, height), (200, 30, 30)).save(path)
    return path


@pytest.fixture
def data(tmp_path) -> Path:
    (tmp_path / 'img').mkdir()
    png(tmp_path / 'img' / 'a.png')
    return tmp_path


def test_good_files_get_a_summary(data):
    good = jsonl(data / 'good.jsonl', GOOD)
    dup = jsonl(data / 'dup.jsonl', [GOOD[0], GOOD[0]])
    proc = check(good, dup)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f'{good}: OK, 4 records' in out
    assert 'domain        math 2, chart 1, code 1' in out
    assert 'data_source   aime2025 2, chartqapro 1, code 1' in out
    assert 'fields        prompt 3, messages 1, domain 4, data_source 3, images 1, answer 3, ' \
           'tests 1, id 4' in out
    assert 'images        found 1, URLs 1 (not fetched)' in out
    assert "warning: 1 repeated ids, e.g. 'm1' at " in out and '2 of 2 files OK' in out


def test_each_broken_file_is_reported_by_its_first_bad_line(data):
    files = {
        'bad_json': ['{"prompt": "a", "domain": "m"}', '{"prompt": "b", "domain": '],
        'missing_field': [GOOD[0], {'prompt': 'b'}],
        'wrong_type': [GOOD[0], GOOD[0], {'prompt': 'c', 'domain': 'm', 'tests': 'print(1)'}],
        'missing_image': [GOOD[0], dict(GOOD[1], images=['img/gone.png'])],
        'empty': [],
    }
    paths = [jsonl(data / f'{name}.jsonl', rows) for name, rows in files.items()]
    proc = check(*paths, data / 'good.parquet')
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    expected = [
        f'{paths[0]}:2: not valid JSON (Expecting value at column 27); each line must be one '
        'complete JSON object',
        f"{paths[1]}:2: field 'domain': missing; name the task family whose reward scores "
        'this record, e.g. "math" (for a file without domains: the dataset\'s '
        "default_domain='math')",
        f"{paths[2]}:3: field 'tests': must be a non-empty list of test objects, got str; "
        'write [{"input": "...", "output": "..."}]',
        f"{paths[3]}:2: field 'images[0]': file {data / 'img' / 'gone.png'} does not exist; fix "
        "the path (relative paths are read from the data file's directory) or remove the image",
        f'{paths[4]}:1: no records (the file is empty)',
        f'dataset file {data / "good.parquet"} does not exist',
    ]
    assert lines[:6] == expected
    assert lines[6] == '0 of 6 files OK'


def test_options_required_fields_and_missing_images(data):
    rows = [GOOD[0], dict(GOOD[1], images=['img/gone.png'])]
    path = jsonl(data / 'd.jsonl', rows)
    proc = check(path, '--allow-missing-images')
    assert proc.returncode == 0 and 'images        found 0, MISSING 1' in proc.stdout
    proc = check(path, '--allow-missing-images', '--required', 'answer', 'tests')
    assert proc.returncode == 1
    assert f"{path}:1: field 'tests': missing; this dataset requires ['answer', 'tests']" \
        in proc.stdout
    assert check().returncode == 2  # usage error


def test_parquet_good_and_bad(data):
    pd.DataFrame([GOOD[0], GOOD[3], dict(GOOD[0], id='m3', images=['img/a.png'])]).to_parquet(
        data / 'good.parquet')
    pd.DataFrame([GOOD[0], dict(GOOD[3], answer=None, domain='')]).to_parquet(
        data / 'bad.parquet')
    (data / 'junk.parquet').write_text('{"prompt": "not parquet"}\n')
    proc = check(data / 'good.parquet', data / 'bad.parquet', data / 'junk.parquet')
    assert proc.returncode == 1
    out = proc.stdout
    assert f'{data / "good.parquet"}: OK, 3 records' in out
    assert 'fields        prompt 3, domain 3, data_source 3, images 1, answer 3, id 3' in out
    assert f"{data / 'bad.parquet'}:row 1: field 'domain': must be a non-empty string" in out
    assert f'{data / "junk.parquet"}: not a readable Parquet file' in out
    assert 'Traceback' not in proc.stderr and 'examples/s' not in proc.stderr


def test_files_with_other_column_names_are_checked_as_the_dataset_reads_them(data):
    rows = [{'question': 'What is 2 + 2?', 'answer': 'Two and two.\n#### 4'},
            {'question': '', 'solution': '#### 1'}]
    path = jsonl(data / 'gsm8k.jsonl', rows)
    proc = check(path, '--fields', 'prompt=question', '--default-domain', 'math',
                 '--required', 'answer')
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[:2] == [
        f"{path}:2: field 'prompt' (from the source field 'question'): must be a non-empty "
        "string, got ''; put the prompt text there",
        f"{path}:2: field 'answer': missing; this dataset requires ['answer'] in every record"]
    proc = check(jsonl(data / 'ok.jsonl', rows[:1]), '--fields', 'prompt=question',
                 '--default-domain', 'math')
    assert proc.returncode == 0, proc.stdout
    assert 'domain        math 1' in proc.stdout
    assert 'fields        prompt 1, answer 1' in proc.stdout
    assert check(path, '--fields', 'prompt').returncode == 2


def test_published_code_benchmarks_are_checked_as_published(data):
    """MBPP (prompt in 'text') and HumanEval records as published pass; MBPP's assert
    strings put under 'tests' are refused with the field name to use."""
    from tests.test_reward.test_code_published import HUMANEVAL_2, MBPP_11
    mbpp = jsonl(data / 'mbpp.jsonl', [MBPP_11])
    proc = check(mbpp, '--fields', 'prompt=text', '--default-domain', 'code')
    assert proc.returncode == 0, proc.stdout
    humaneval = jsonl(data / 'humaneval.jsonl', [HUMANEVAL_2])
    assert check(humaneval, '--default-domain', 'code').returncode == 0
    renamed = dict(MBPP_11, tests=MBPP_11['test_list'])
    del renamed['test_list']
    proc = check(jsonl(data / 'bad.jsonl', [renamed]), '--fields', 'prompt=text',
                 '--default-domain', 'code')
    assert proc.returncode == 1
    assert "field 'tests': is a list of strings" in proc.stdout
    assert "name the field 'test_list'" in proc.stdout


def test_a_utf8_byte_order_mark_is_read(data):
    path = data / 'bom.jsonl'
    path.write_bytes('\ufeff'.encode() + ''.join(json.dumps(r) + '\n' for r in GOOD[:2]).encode())
    proc = check(path)
    assert proc.returncode == 0, proc.stdout
    assert f'{path}: OK, 2 records' in proc.stdout


def test_images_that_do_not_decode_are_refused_with_record_and_file(data):
    good = png(data / 'img' / 'b.png').read_bytes()
    (data / 'img' / 'cut.png').write_bytes(good[:len(good) // 2])  # truncated pixel data
    (data / 'img' / 'text.png').write_text('not an image')
    rows = [GOOD[0], dict(GOOD[1], images=['img/cut.png']), dict(GOOD[1], images=['img/text.png'])]
    path = jsonl(data / 'broken_images.jsonl', rows)
    proc = check(path)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"{path}:2: field 'images[0]': {data / 'img' / 'cut.png'} does "
                               'not decode as an image (')
    assert lines[1].startswith(f"{path}:3: field 'images[0]': {data / 'img' / 'text.png'} does "
                               'not decode as an image (')
    assert lines[1].endswith('re-save it as PNG or JPEG, or remove it from the record')


@pytest.fixture(scope='module')
def models(tmp_path_factory) -> dict[str, Path]:
    """A text tokenizer without a chat template and a Qwen2-VL processor, as saved by
    transformers (max_pixels 84 x 84, the tiny test model's)."""
    from gepo_xtuner.testbed.tiny_vl import build_vl_processor, build_vl_tokenizer
    out = tmp_path_factory.mktemp('models')
    tokenizer = build_vl_tokenizer()
    tokenizer.chat_template = None
    tokenizer.save_pretrained(out / 'plain')
    build_vl_processor(build_vl_tokenizer()).save_pretrained(out / 'vl')
    return dict(plain=out / 'plain', vl=out / 'vl')


def test_chat_records_need_the_models_chat_template(data, models):
    chat = {'id': 'c', 'domain': 'math', 'answer': '4',
            'messages': [{'role': 'user', 'content': 'What is 2 + 2?'}]}
    path = jsonl(data / 'chat.jsonl', [GOOD[0], chat])
    proc = check(path, '--model', models['plain'])
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[0] == (
        f"{path}:2: field 'messages': chat turns need a chat template, and {models['plain']} has "
        "none; use the chat model's tokenizer (model.tokenizer, whose tokenizer_config.json sets "
        'chat_template), or give the text as "prompt"')
    assert check(path, '--model', models['vl']).returncode == 0
    assert check(path).returncode == 0  # without a model: the schema only


def test_images_below_the_processors_minimum_and_above_its_maximum(data, models):
    png(data / 'img' / 'tiny.png', 20, 40)
    png(data / 'img' / 'huge.png', 400, 300)
    rows = [dict(GOOD[1], images=['img/a.png']), dict(GOOD[1], images=['img/tiny.png']),
            dict(GOOD[1], images=['img/huge.png'])]
    path = jsonl(data / 'sizes.jsonl', rows)
    proc = check(path, '--model', models['vl'])
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[0] == (
        f"{path}:2: field 'images[0]': {data / 'img' / 'tiny.png'} is 20x40 px, below the 28 px "
        f"per side that {models['vl']}'s image processor needs (patch_size x merge_size); "
        'upscale or pad it to at least 28x28 (e.g. PIL.ImageOps.pad), or remove it')
    proc = check(jsonl(data / 'big.jsonl', [rows[0], rows[2]]), '--model', models['vl'])
    assert proc.returncode == 0, proc.stdout
    assert (f"warning: {data / 'big.jsonl'}:2: field 'images[0]': {data / 'img' / 'huge.png'} "
            f"is 400x300 px (0.1 M), above the max_pixels 7056 of {models['vl']}: it is decoded "
            'and downscaled again on every step that draws it') in proc.stdout
