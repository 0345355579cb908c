"""Validator: per-domain and per-benchmark validation, avg@n, sampling options, a real run.

The unit tests drive :class:`Validator` with the parts the training loop hands it,
all real: the tiny random policy in an :class:`HFRolloutBackend`, its tokenizer, a
:class:`RewardRouter`. The last test trains for real with two benchmarks.
"""

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gepo_xtuner.analysis.curves import _series
from gepo_xtuner.engine.step.prompt_encoding import encode_request
from gepo_xtuner.engine.step.validation import Validator, ValSettings
from gepo_xtuner.reward import RewardRouter
from gepo_xtuner.rollout import HFRolloutBackend, SamplingParams

from .conftest import scalars, train, write_config


def make_validator(**val) -> Validator:
    """The validator a run builds from ``train_cfg.val = dict(**val)``."""
    return Validator(ValSettings.from_dict(val))


pytestmark = pytest.mark.usefixtures('one_thread')  # tests/conftest.py


class Recorder:
    """A reward that remembers each call: 1.0 for completions of at most 3 characters."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, completion: str, record: dict) -> float:
        self.calls.append((record['id'], completion))
        return float(len(completion.strip()) <= 3)


def loop_parts(model_dir: Path, reward, max_new_tokens: int = 6) -> SimpleNamespace:
    """What RLTrainLoop hands Validator.run, built from the real components."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    rollout = HFRolloutBackend(max_sequences_per_call=64)
    rollout.attach(model, tok)
    return SimpleNamespace(tokenizer=tok, rollout=rollout,
                           rewards=RewardRouter(dict(default=reward)),
                           sampling=SamplingParams(n=4, temperature=1.0,
                                                   max_new_tokens=max_new_tokens,
                                                   stop_token_ids=(tok.eos_token_id, )),
                           encode_requests=lambda records: [
                               encode_request(r, tok, None, '{prompt}=') for r in records])


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write(path: Path, records: list[dict]) -> str:
    path.write_text(''.join(json.dumps(r) + '\n' for r in records))
    return str(path)


def test_single_file_form_logs_each_domain_as_before(tiny_dir):
    parts = loop_parts(tiny_dir / 'model', lambda c, r: float(r['domain'] == 'copy'))
    metrics = make_validator(path=str(tiny_dir / 'data' / 'val.jsonl'), interval=3).run(**vars(parts))
    assert metrics == {'val/add/acc': 0.0, 'val/copy/acc': 1.0, 'val/mul/acc': 0.0,
                       'val/sort/acc': 0.0, 'val/acc': 0.25}


def test_benchmarks_average_n_samples_and_follow_their_sampling(tiny_dir, tmp_path):
    val = read(tiny_dir / 'data' / 'val.jsonl')
    letters = [r for r in val if r['domain'] in ('copy', 'sort')]
    reward = Recorder()
    parts = loop_parts(tiny_dir / 'model', reward)
    validator = make_validator(interval=2, benchmarks=[
        dict(name='letters', path=write(tmp_path / 'letters.jsonl', letters), n=2,
             temperature=1.0),
        dict(name='greedy', path=str(tiny_dir / 'data' / 'val.jsonl'), max_new_tokens=3)])
    torch.manual_seed(0)
    metrics = validator.run(**vars(parts))
    assert set(metrics) == {'val/letters/acc', 'val/greedy/acc', 'val/acc'}
    # letters: n=2 samples per record, scored one by one, averaged over all of them
    sampled, greedy = reward.calls[:2 * len(letters)], reward.calls[2 * len(letters):]
    assert [i for i, _ in sampled] == [r['id'] for r in letters for _ in range(2)]
    assert metrics['val/letters/acc'] == pytest.approx(
        sum(len(c.strip()) <= 3 for _, c in sampled) / len(sampled))
    # ... which is what sampling the same way by hand gives
    torch.manual_seed(0)
    again = parts.rollout.generate(
        parts.encode_requests(letters),
        SamplingParams(n=2, temperature=1.0, max_new_tokens=6, stop_token_ids=(2, )))
    texts = parts.tokenizer.batch_decode([s.response_ids for g in again for s in g],
                                                skip_special_tokens=True)
    assert texts == [c for _, c in sampled]
    # greedy: one sample each, capped at the benchmark's 3 new tokens (one character each)
    assert len(greedy) == len(val) and all(len(c) <= 3 for _, c in greedy)
    assert metrics['val/acc'] == pytest.approx(
        (metrics['val/letters/acc'] + metrics['val/greedy/acc']) / 2)

    reward.calls.clear()
    torch.manual_seed(1)  # another seed: new samples, the same greedy answers
    validator.run(**vars(parts))
    assert reward.calls[2 * len(letters):] == greedy
    assert reward.calls[:2 * len(letters)] != sampled


def test_parquet_benchmark_and_defaults_from_the_top_level(tiny_dir, tmp_path):
    val = read(tiny_dir / 'data' / 'val.jsonl')
    pd.DataFrame(val).to_parquet(tmp_path / 'val.parquet')
    validator = make_validator(interval=1, n=3, temperature=0.7, benchmarks=[
        dict(name='pq', path=str(tmp_path / 'val.parquet')),
        dict(name='one', path=str(tiny_dir / 'data' / 'val.jsonl'), n=1, temperature=0.0)])
    pq, one = validator.sets
    assert (pq.sampling.n, pq.sampling.temperature, one.sampling.n,
            one.sampling.temperature) == (3, 0.7, 1, 0.0)
    assert [r['id'] for r in pq.records] == [r['id'] for r in val]
    reward = Recorder()
    validator.run(**vars(loop_parts(tiny_dir / 'model', reward)))
    assert len(reward.calls) == 3 * len(val) + len(val)


@pytest.mark.parametrize('kwargs, message', [
    (dict(), 'val needs path='),
    (dict(interval=0, path='x'), 'interval must be >= 1'),
    (dict(benchmarks=dict(name='a')), 'must be a list of dicts'),
    (dict(benchmarks=[dict(name='a', path='{val}', temp=1)]), r"does not take \['temp'\]"),
    (dict(benchmarks=[dict(path='{val}')]), r'val.benchmarks\[0\].name must be'),
    (dict(benchmarks=[dict(name='a/b', path='{val}')]), 'without "/"'),
    (dict(benchmarks=[dict(name='a')]), r'val.benchmarks\[0\].path must be a data file'),
    (dict(benchmarks=[dict(name='a', path='{val}', temperature=-1)]),
     r"val.benchmarks\[0\] \(a\): sampling temperature must be >= 0"),
    (dict(benchmarks=[dict(name='a', path='{val}'), dict(name='a', path='{val}')]),
     'two metrics would be named val/a/acc'),
    (dict(path='{val}', benchmarks=[dict(name='copy', path='{val}')]),
     'two metrics would be named val/copy/acc'),
    (dict(benchmarks=[dict(name='a', path='{val}', required=['tests'])]),
     "field 'tests': missing"),
])
def test_bad_configuration_says_what_to_fix(tiny_dir, kwargs, message):
    val = str(tiny_dir / 'data' / 'val.jsonl')
    kwargs = json.loads(json.dumps(kwargs).replace('{val}', val))
    with pytest.raises(ValueError, match=message):
        make_validator(**kwargs)


def test_training_logs_each_benchmark_at_the_validation_steps(tmp_path, tiny_dir):
    val = read(tiny_dir / 'data' / 'val.jsonl')
    arith = write(tmp_path / 'arith.jsonl', [r for r in val if r['domain'] in ('add', 'mul')])
    letters = tmp_path / 'letters.parquet'
    pd.DataFrame([r for r in val if r['domain'] in ('copy', 'sort')]).to_parquet(letters)
    cfg = write_config(tmp_path, extra=f"""
        train_cfg = dict(val=dict(_delete_=True, interval=2, benchmarks=[
            dict(name='arith', path='{arith}'),
            dict(name='letters', path='{letters}', n=2, temperature=1.0, max_new_tokens=4)]))
    """)
    work = tmp_path / 'run'
    train(cfg, work, tiny_dir, 'train_cfg.max_steps=3')
    logged = scalars(work)
    for step in (0, 2, 3):  # before the first step, every 2 steps, after the last
        row = logged[step]
        assert row['val/acc'] == pytest.approx((row['val/arith/acc'] + row['val/letters/acc']) / 2)
    assert not any(k.startswith('val/') for k in logged[1])  # no validation at step 1
    assert not any(k.startswith(('val/add', 'val/copy')) for row in logged.values() for k in row)
    history = json.loads((work / 'training_curves.json').read_text())
    assert [int(r['step']) for r in history if 'val/arith/acc' in r] == [0, 2, 3]
    assert set(_series(history, 'val/', '/acc')) == {'arith', 'letters'}  # the figure's curves
    assert (work / 'training_curves.png').read_bytes()[:4] == b'\x89PNG'
