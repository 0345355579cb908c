"""The synthetic task mix: correct answers, determinism, disjoint splits, files, reward."""

import doctest
import random
from collections import Counter

import pytest

from gepo_xtuner.testbed import synthetic_tasks
from gepo_xtuner.testbed.synthetic_tasks import (DOMAINS, MAX_ANSWER_CHARS, TASK_CHARS,
                                              build_task_files, generate_split, make_record,
                                              read_jsonl, score, split_of, write_jsonl)


def solve(domain: str, prompt: str) -> str:
    """An independent solver, so a wrong generator answer cannot go unnoticed."""
    if domain == 'copy':
        return prompt.removeprefix('copy:')
    if domain == 'sort':
        return ''.join(sorted(prompt.removeprefix('sort:')))
    a, b = (int(x) for x in prompt.replace('*', '+').split('+'))
    return str(a + b if domain == 'add' else a * b)


@pytest.mark.parametrize('domain', DOMAINS)
def test_records_are_solvable_and_use_known_chars(domain):
    rng = random.Random(0)
    for _ in range(500):
        rec = make_record(domain, rng)
        assert rec['domain'] == domain
        assert rec['answer'] == solve(domain, rec['prompt'])
        assert set(rec['prompt'] + rec['answer']) <= set(TASK_CHARS)
        assert 1 <= len(rec['answer']) <= MAX_ANSWER_CHARS


def test_unknown_domain_and_split_raise():
    with pytest.raises(ValueError, match='unknown domain'):
        make_record('divide', random.Random(0))
    with pytest.raises(ValueError, match='split'):
        generate_split('test', 3, 0)


def test_generate_split_is_deterministic_per_seed():
    assert generate_split('train', 50, 3) == generate_split('train', 50, 3)
    assert generate_split('val', 50, 3) == generate_split('val', 50, 3)
    assert generate_split('train', 50, 3) != generate_split('train', 50, 4)


def test_every_domain_present_with_unique_ids():
    for split in ('sft', 'train', 'val'):
        recs = generate_split(split, 25, 0)
        assert Counter(r['domain'] for r in recs) == {d: 25 for d in DOMAINS}
        assert len({r['id'] for r in recs}) == len(recs)
        assert all(r['id'].startswith(f'{split}-{r["domain"]}-') for r in recs)


def test_splits_are_disjoint_even_across_seeds():
    val = generate_split('val', 200, 0)
    train = generate_split('train', 2000, 0) + generate_split('train', 500, 1)
    sft = generate_split('sft', 2000, 0) + generate_split('sft', 500, 2)
    assert not {r['prompt'] for r in val} & {r['prompt'] for r in train}
    assert not {r['prompt'] for r in val} & {r['prompt'] for r in sft}
    # RL prompts are new to the warm-started policy
    assert not {r['prompt'] for r in sft} & {r['prompt'] for r in train}
    assert all(split_of(r['prompt']) == 'sft' for r in sft)
    assert all(split_of(r['prompt']) == 'val' for r in val)
    # val prompts are distinct, so accuracy is over 200 different problems per domain
    assert len({r['prompt'] for r in val}) == len(val)


def test_val_larger_than_its_prompt_space_raises():
    # add has 1000 prompts in all, about a fifth of them in val
    with pytest.raises(ValueError, match='distinct val prompts'):
        generate_split('val', 400, 0)


def test_jsonl_files(tmp_path):
    paths = build_task_files(tmp_path / 'data', 30, 10, seed=5)
    assert set(paths) == {'train', 'val'}
    assert read_jsonl(paths['train']) == generate_split('train', 30, 5)
    assert read_jsonl(paths['val']) == generate_split('val', 10, 5)
    lines = paths['val'].read_text().splitlines()
    assert len(lines) == 40 and all(line.startswith('{') for line in lines)
    assert sorted((tmp_path / 'data').iterdir()) == sorted(paths.values())  # no temp files


def test_write_jsonl_overwrites_whole_file(tmp_path):
    path = write_jsonl([{'a': i} for i in range(5)], tmp_path / 'x.jsonl')
    write_jsonl([{'b': 1}], path)
    assert read_jsonl(path) == [{'b': 1}]


def test_score():
    assert score('add', '55', '55') == 1.0
    assert score('copy', '  abc \n', 'abc') == 1.0
    assert score('add', '56', '55') == 0.0
    assert score('sort', 'ab c', 'abc') == 0.0  # only surrounding whitespace is forgiven
    assert score('mul', '', '0') == 0.0


def test_doctests():
    assert doctest.testmod(synthetic_tasks).failed == 0
    assert doctest.testmod(synthetic_tasks).attempted >= 2


def test_demonstration_noise_reverses_a_share_per_domain_deterministically():
    from gepo_xtuner.testbed.synthetic_tasks import with_demonstration_noise
    clean = generate_split('sft', 2000, 0)
    noisy = with_demonstration_noise(clean, {'add': 0.3, 'copy': 0.0}, seed=0)
    assert noisy == with_demonstration_noise(clean, {'add': 0.3, 'copy': 0.0}, seed=0)
    assert clean == generate_split('sft', 2000, 0)  # input untouched
    for rec, out in zip(clean, noisy):
        assert {k: v for k, v in out.items() if k != 'answer'} == \
            {k: v for k, v in rec.items() if k != 'answer'}
        assert out['answer'] in (rec['answer'], rec['answer'][::-1])
        if rec['domain'] != 'add':
            assert out == rec
    flipped = sum(o['answer'] != r['answer'] for r, o in zip(clean, noisy) if r['domain'] == 'add')
    candidates = sum(r['answer'] != r['answer'][::-1] for r in clean if r['domain'] == 'add')
    assert abs(flipped / candidates - 0.3) < 0.05  # ~30 % of those a reversal changes
    with pytest.raises(ValueError, match='shares in'):
        with_demonstration_noise(clean, {'div': 0.1}, seed=0)
