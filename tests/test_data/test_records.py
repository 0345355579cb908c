"""The record schema: validation messages, JSONL and Parquet loading, PromptDataset, prompts."""

import json
from pathlib import Path

import pandas as pd
import pytest

from gepo_xtuner.data import (DataFormatError, PromptDataset, encode_prompt, load_records,
                              validate_record)
from gepo_xtuner.testbed.tiny import build_char_tokenizer

EXAMPLES = [  # one record per domain of docs/data.md
    {'id': 'm1', 'domain': 'math', 'data_source': 'aime2025', 'prompt': 'Find x.',
     'answer': '70'},
    {'id': 'p1', 'domain': 'physics', 'prompt': 'How far?', 'answer': 3.2, 'unit': 'km'},
    {'id': 's1', 'domain': 'science', 'data_source': 'gpqa', 'prompt': 'Which?',
     'choices': ['a', 'b', 'c', 'd'], 'answer': 'C'},
    {'id': 'c1', 'domain': 'code', 'data_source': 'livecodebench', 'prompt': 'Sum.',
     'tests': [{'input': '1 2\n', 'output': '3\n'}], 'metadata': {'difficulty': 'easy'}},
    {'id': 'i1', 'domain': 'instruction', 'data_source': 'ifeval',
     'messages': [{'role': 'system', 'content': 'Be brief.'},
                  {'role': 'user', 'content': 'Write without commas.'}],
     'instructions': [{'id': 'punctuation:no_comma', 'kwargs': {}}]},
    {'id': 'v1', 'domain': 'chart', 'data_source': 'chartqapro', 'images': ['img/chart.png'],
     'messages': [{'role': 'user', 'content': [{'type': 'image'},
                                               {'type': 'text', 'text': 'Largest bar?'}]}],
     'answer': ['Brazil', '3500']},
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text(''.join((r if isinstance(r, str) else json.dumps(r)) + '\n' for r in rows))
    return path


@pytest.fixture
def data_dir(tmp_path) -> Path:
    (tmp_path / 'img').mkdir()
    (tmp_path / 'img' / 'chart.png').write_bytes(b'\x89PNG')
    return tmp_path


def test_every_documented_example_loads_and_is_normalised(data_dir):
    records = load_records(write_jsonl(data_dir / 'mix.jsonl', EXAMPLES))
    assert [r['id'] for r in records] == [e['id'] for e in EXAMPLES]
    assert records[0]['data_source'] == 'aime2025' and records[1]['data_source'] == 'physics'
    assert records[5]['images'] == [str(data_dir / 'img' / 'chart.png')]  # absolute now
    assert records[1]['answer'] == 3.2 and records[0]['answer'] == '70'  # JSON types kept


@pytest.mark.parametrize('change, message', [
    ({'prompt': None}, "field 'prompt': missing; give the text as \"prompt\""),
    ({'prompt': '  '}, "field 'prompt': must be a non-empty string"),
    ({'messages': [{'role': 'user', 'content': 'x'}]}, 'has both "prompt" and "messages"'),
    ({'domain': 3}, "field 'domain': must be a non-empty string, got 3"),
    ({'data_source': ''}, "field 'data_source': must be a non-empty string"),
    ({'answer': {'x': 1}}, "field 'answer': must be a string, a number or a non-empty list"),
    ({'answer': True}, "field 'answer'"),
    ({'choices': 'ABCD'}, "field 'choices': must be a non-empty list"),
    ({'unit': 3}, "field 'unit': must be a string, got int"),
    ({'tests': []}, "field 'tests': must be a non-empty list of test objects"),
    ({'instructions': [{'kwargs': {}}]}, "field 'instructions[0]': must be an object with"),
    ({'instruction_id_list': []}, "field 'instruction_id_list': must be a non-empty list"),
    ({'instruction_id_list': ['punctuation:no_comma'], 'kwargs': [{}, {}]},
     "field 'kwargs': must be a list of 1 objects (one per instruction id), got 2 items"),
    ({'instruction_id_list': ['punctuation:no_comma'], 'kwargs': ['x']},
     "field 'kwargs[0]': must be an object, got str"),
    ({'metadata': [1]}, "field 'metadata': must be an object, got list"),
    ({'id': 1.5}, "field 'id': must be a non-empty string or an integer"),
    ({'images': 'a.png'}, "field 'images': must be a list of paths or URLs, got str"),
    ({'images': ['missing.png']}, "field 'images[0]': file "),
])
def test_bad_fields_name_file_line_field_and_fix(tmp_path, change, message):
    record = {'prompt': 'p', 'domain': 'math', **change}
    record = {k: v for k, v in record.items() if v is not None}
    path = write_jsonl(tmp_path / 'd.jsonl', [EXAMPLES[0], record])
    with pytest.raises(DataFormatError) as err:
        load_records(path)
    text = str(err.value)
    assert text.startswith(f'{path}:2: ') and message in text
    assert '; ' in text  # the reason is followed by how to fix it


@pytest.mark.parametrize('messages, message', [
    ([], 'must be a non-empty list of turns'),
    ([{'role': 'robot', 'content': 'x'}], "field 'messages[0].role': must be one of"),
    ([{'role': 'user', 'content': 3}], "field 'messages[0].content': must be a string"),
    ([{'role': 'user', 'content': [{'text': 'x'}]}], "'messages[0].content[0]'"),
    ([{'role': 'user', 'content': 'q'}, {'role': 'assistant', 'content': 'a'}],
     "the last turn is the assistant's"),
])
def test_bad_messages(messages, message):
    with pytest.raises(DataFormatError, match=message.replace('[', r'\[').replace(']', r'\]')):
        validate_record({'messages': messages, 'domain': 'chat'}, 'f.jsonl:1')


def test_json_errors_lines_ids_and_required(tmp_path):
    path = write_jsonl(tmp_path / 'd.jsonl', [EXAMPLES[0], '', '{"prompt": "x", "domain": '])
    with pytest.raises(DataFormatError, match=rf'^{path}:3: not valid JSON'):
        load_records(path)
    path.write_bytes(b'{"prompt": "\xff", "domain": "m"}\n')
    with pytest.raises(DataFormatError, match=rf'^{path}:1: not UTF-8 text'):
        load_records(path)
    path = write_jsonl(tmp_path / 'd.jsonl', [[1, 2]])
    with pytest.raises(DataFormatError, match='expected a JSON object'):
        load_records(path)
    path = write_jsonl(tmp_path / 'ids.jsonl', [{'prompt': 'a', 'domain': 'm'},
                                               {'prompt': 'b', 'domain': 'm', 'id': 7}, '',
                                               {'prompt': 'c', 'domain': 'm', 'id': 'ids-1'}])
    assert [r['id'] for r in load_records(path)] == ['ids-1', '7', 'ids-1']
    with pytest.raises(DataFormatError, match=rf"{path}:4: field 'id': 'ids-1' is already the "
                                              rf'id of {path}:1'):
        load_records(path, unique_ids=True)
    with pytest.raises(DataFormatError, match=r"field 'answer': missing; this dataset requires"):
        load_records(path, required=['answer'])
    (tmp_path / 'empty.jsonl').write_text('\n\n')
    with pytest.raises(DataFormatError, match='no records'):
        load_records(tmp_path / 'empty.jsonl')
    with pytest.raises(FileNotFoundError, match='does not exist'):
        load_records(tmp_path / 'nope.jsonl')


# One type per column, as Parquet needs: string answers, string message contents.
COLUMNAR = [EXAMPLES[0], dict(EXAMPLES[1], answer='3.2'), *EXAMPLES[2:5],
            dict(EXAMPLES[4], id='i2', instructions=[
                {'id': 'length_constraints:number_words',
                 'kwargs': {'num_words': 30, 'relation': 'less than'}}]),
            dict(EXAMPLES[5], answer='Brazil', messages=[{'role': 'user', 'content': 'Bar?'}])]


def test_parquet_matches_jsonl_and_names_rows(data_dir):
    jsonl = load_records(write_jsonl(data_dir / 'mix.jsonl', COLUMNAR))
    # a columnar file stores absent fields and keys as nulls: they must read as absent again
    pd.DataFrame(COLUMNAR).to_parquet(data_dir / 'mix.parquet')
    assert load_records(data_dir / 'mix.parquet') == jsonl
    bad = [dict(EXAMPLES[0]), dict(EXAMPLES[0], unit=5)]
    pd.DataFrame(bad).to_parquet(data_dir / 'bad.parquet')
    with pytest.raises(DataFormatError, match=rf"^{data_dir / 'bad.parquet'}:row 1: field "
                                              "'unit'"):
        load_records(data_dir / 'bad.parquet')
    (data_dir / 'junk.parquet').write_text('not parquet')
    with pytest.raises(DataFormatError, match='not a readable Parquet file'):
        load_records(data_dir / 'junk.parquet')


def test_prompt_dataset_reads_both_formats(data_dir):
    write_jsonl(data_dir / 'mix.jsonl', COLUMNAR)
    pd.DataFrame(COLUMNAR).to_parquet(data_dir / 'mix.parquet')
    a, b = PromptDataset(str(data_dir / 'mix.jsonl')), PromptDataset(str(data_dir / 'mix.parquet'))
    assert len(a) == len(b) == 7 and a.records == b.records
    assert a.metainfo['data_sources'] == sorted({'aime2025', 'physics', 'gpqa', 'livecodebench',
                                                 'ifeval', 'chartqapro'})
    with pytest.raises(DataFormatError, match="field 'answer': missing"):
        PromptDataset(str(data_dir / 'mix.parquet'), required=['answer'])


def test_encode_prompt_template_and_chat_template():
    tok = build_char_tokenizer()
    record = {'id': 'r', 'prompt': '1+2', 'domain': 'add'}
    assert encode_prompt(tok, record, '{prompt}=') == tok('1+2=')['input_ids']
    with pytest.raises(ValueError, match="names the field 'question'"):
        encode_prompt(tok, record, '{question}')
    chat = {'id': 'c', 'domain': 'add', 'messages': [{'role': 'system', 'content': 'add'},
                                                     {'role': 'user', 'content': '1+2'}]}
    with pytest.raises(ValueError, match='tokenizer has no chat template'):
        encode_prompt(tok, chat)
    tok.chat_template = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }} "
                         "{% endfor %}{% if add_generation_prompt %}a:{% endif %}")
    assert tok.decode(encode_prompt(tok, chat, '{ignored}')) == 's:add u:1+2 a:'


def test_every_problem_of_a_record_is_reported_at_once(tmp_path):
    bad = {'prompt': ' ', 'domain': 3, 'answer': {'x': 1}, 'unit': 5, 'id': 1.5,
           'instructions': [{'kwargs': {}}, {'id': 'a', 'kwargs': 'b'}]}
    path = write_jsonl(tmp_path / 'd.jsonl', [dict(EXAMPLES[0], tests=[{}]), bad])
    with pytest.raises(DataFormatError) as err:
        load_records(path, required=['answer', 'tests'])
    lines = str(err.value).splitlines()
    assert [line.split(': ')[1] for line in lines] == [
        "field 'prompt'", "field 'domain'", "field 'answer'", "field 'unit'",
        "field 'instructions[0]'", "field 'instructions[1].kwargs'", "field 'id'",
        "field 'tests'"]
    assert all(line.startswith(f'{path}:2: ') and '; ' in line for line in lines)


# GSM8K as published: no domain, the prompt under "question", the answer after "####".
GSM8K = [
    {'question': 'Natalia sold clips to 48 of her friends in April, and then she sold half as '
                 'many clips in May. How many clips did Natalia sell altogether?',
     'answer': 'Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = '
               '<<48+24=72>>72 clips altogether in April and May.\n#### 72'},
    {'question': 'Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes '
                 'of babysitting. How much did she earn?',
     'answer': 'Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she '
               'earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10'},
]


def test_field_mapping_and_default_domain_read_gsm8k_as_published(tmp_path):
    path = write_jsonl(tmp_path / 'gsm8k.jsonl', GSM8K)
    with pytest.raises(DataFormatError) as err:  # as is: no prompt, no domain
        PromptDataset(str(path))
    assert str(err.value).splitlines() == [
        f"{path}:1: field 'prompt': missing; give the text as \"prompt\": \"...\" or chat turns "
        'as "messages": [{"role": "user", "content": "..."}] (another name: map it with the '
        "dataset's fields=dict(prompt='question'))",
        f"{path}:1: field 'domain': missing; name the task family whose reward scores this "
        "record, e.g. \"math\" (for a file without domains: the dataset's "
        "default_domain='math')"]
    data = PromptDataset(str(path), fields=dict(prompt='question', answer='answer'),
                         default_domain='math', required=['answer'])
    assert data[0] == {'prompt': GSM8K[0]['question'], 'answer': GSM8K[0]['answer'],
                       'domain': 'math', 'data_source': 'math', 'id': 'gsm8k-1'}
    assert data.metainfo['domains'] == ['math']
    # a record's own domain wins over the default; a mapped field names its source in errors
    path = write_jsonl(tmp_path / 'mixed.jsonl', [dict(GSM8K[0], domain='arith'),
                                                  {'answer': '#### 1'}])
    with pytest.raises(DataFormatError, match=r":2: field 'prompt' \(from the source field "
                                              r"'question'\): missing"):
        PromptDataset(str(path), fields=dict(prompt='question'), default_domain='math')
    path = write_jsonl(tmp_path / 'mixed.jsonl', [dict(GSM8K[0], domain='arith')])
    assert PromptDataset(str(path), fields=dict(prompt='question'),
                         default_domain='math')[0]['domain'] == 'arith'


@pytest.mark.parametrize('kwargs, message', [
    (dict(fields=['prompt', 'question']), 'fields must map record fields to source field'),
    (dict(fields={'prompt': ''}), 'fields must map record fields to source field'),
    (dict(default_domain=''), 'default_domain must be a non-empty string'),
])
def test_bad_dataset_options_say_what_to_write(tmp_path, kwargs, message):
    path = write_jsonl(tmp_path / 'gsm8k.jsonl', GSM8K)
    with pytest.raises(ValueError, match=message):
        PromptDataset(str(path), **kwargs)
