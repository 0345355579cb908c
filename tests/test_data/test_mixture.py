"""``PromptMixture``: files in different schemas read as one training set."""

import json

import pytest

from gepo_xtuner.data import DataFormatError, PromptDataset, PromptMixture


def write(path, rows):
    path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    return str(path)


def test_parts_keep_their_own_field_mapping(tmp_path):
    gsm8k = write(tmp_path / 'gsm8k.jsonl', [
        {'question': 'Ann has 2 cats and gets 3 more. How many?', 'answer': '2+3=5\n#### 5'},
        {'question': 'What is 4 times 6?', 'answer': '#### 24'}])
    code = write(tmp_path / 'code.jsonl', [
        {'domain': 'code', 'prompt': 'Print the input.', 'tests': [{'input': 'a\n',
                                                                     'output': 'a\n'}]}])
    mix = PromptMixture([dict(type='PromptDataset', path=gsm8k, fields=dict(prompt='question'),
                              default_domain='math', required=['answer']),
                         PromptDataset(code, required=['tests'])])
    assert len(mix) == 3 and [r['domain'] for r in mix.records] == ['math', 'math', 'code']
    assert mix[0]['prompt'].startswith('Ann has') and 'question' not in mix[0]
    assert mix[2]['tests'][0]['output'] == 'a\n'
    assert mix.metainfo['domains'] == ['code', 'math'] and mix.metainfo['num_records'] == 3


def test_bad_parts_say_what_to_fix(tmp_path):
    with pytest.raises(ValueError, match='at least one'):
        PromptMixture([])
    with pytest.raises(ValueError, match=r'datasets\[0\] is a list'):
        PromptMixture([[1, 2]])
    bad = write(tmp_path / 'bad.jsonl', [{'domain': 'code', 'prompt': 'x', 'tests': 'no'}])
    with pytest.raises(DataFormatError, match=r'bad\.jsonl:1: field .tests.'):
        PromptMixture([dict(type='PromptDataset', path=bad)])
