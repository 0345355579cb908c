"""Tests of ``benchmarks/async_sim.py``, the scheduler simulation: closed-form cases
(constant lengths, one server), the orderings the schedules must show, the staleness bound,
determinism, calibration, and the CLI's printed lines."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.async_sim import (EngineParams, TrainerParams, Workload, calibrate, predict,
                                  simulate)

ROOT = Path(__file__).resolve().parents[2]


def _const(L: int = 50, **kw) -> Workload:
    base = dict(servers=1, prompts=2, responses=4, steps=5, warmup=2, prompt_len=10,
                lengths='const', median=L, max_new_tokens=10_000, max_staleness=2)
    base.update(kw)
    return Workload(**base)


def _train(tr: TrainerParams, w: Workload) -> float:
    return tr.t0 + tr.t_tok * w.prompts * w.responses * (w.median + w.prompt_len) / tr.ranks


def test_sync_step_is_generation_plus_train_plus_push_exactly() -> None:
    eng = EngineParams(a=0.01, c=0.0, p=0.0, max_running=64)
    tr = TrainerParams(t0=0.3, t_tok=1e-3, ranks=2, push_s=0.2)
    w = _const()
    r = simulate(eng, tr, w, ('sync',))['sync']
    step = 50 * 0.01 + _train(tr, w) + 0.2
    assert r.step_times == pytest.approx([step] * w.steps, abs=1e-9)
    assert r.gen_s == pytest.approx([0.5] * w.steps, abs=1e-9)
    assert r.staleness_max == 0 and r.staleness_mean == 0.0


def test_engine_costs_batch_and_prefill_and_queues_beyond_max_running() -> None:
    # 8 sequences, 4 slots: two waves; each pays p * prompt_len at its first iteration.
    eng = EngineParams(a=0.01, c=0.001, p=0.002, max_running=4)
    tr = TrainerParams(t0=1.0, t_tok=0.0, ranks=1, push_s=0.5)
    r = simulate(eng, tr, _const(L=20), ('sync',))['sync']
    wave = 4 * 0.002 * 10 + 20 * (0.01 + 0.001 * 4)
    assert r.gen_s[0] == pytest.approx(2 * wave, abs=1e-9)
    assert r.step_s == pytest.approx(2 * wave + 1.0 + 0.5, abs=1e-9)


@pytest.mark.parametrize('t0', [0.2, 3.0])  # generation-bound, then train-bound
def test_k1_steady_step_is_max_of_generation_and_train_plus_push(t0: float) -> None:
    eng = EngineParams(a=0.02, c=0.0, p=0.0, max_running=64)
    tr = TrainerParams(t0=t0, t_tok=0.0, ranks=1, push_s=0.25)
    w = _const(steps=6)
    r = simulate(eng, tr, w, ('sync', 'k1'))
    gen = 50 * 0.02
    assert r['k1'].step_times[w.warmup:] == pytest.approx(
        [max(gen, t0) + 0.25] * (w.steps - w.warmup), abs=1e-9)
    assert r['k1'].step_s == pytest.approx(r['k1'].ideal_step_s, abs=1e-9)
    assert r['sync'].step_s == pytest.approx(gen + t0 + 0.25, abs=1e-9)
    assert r['k1'].staleness_max == 1 and r['k1'].staleness_mean == 1.0


def test_partial_rollouts_beat_waiting_for_the_tail() -> None:
    eng = EngineParams(a=0.01, c=0.0005, p=1e-5, max_running=64)
    tr = TrainerParams(t0=1.0, t_tok=2e-4, ranks=1, push_s=0.2)
    w = Workload(servers=2, prompts=8, responses=4, steps=8, warmup=2, prompt_len=16,
                 lengths='lognormal', median=100, tail=10.0, max_new_tokens=2000,
                 max_staleness=2, seed=1)
    r = simulate(eng, tr, w)
    assert r['stream_partial'].tokens_per_s > 1.2 * r['stream'].tokens_per_s
    assert r['stream_partial'].speedup > 1.2
    for name in ('k1', 'stream', 'stream_partial'):  # none is slower than its ideal
        assert r[name].step_s >= r[name].ideal_step_s - 1e-9


@pytest.mark.parametrize('k', [2, 3])
def test_staleness_never_exceeds_max_staleness(k: int) -> None:
    eng = EngineParams(a=0.01, c=0.0005, p=1e-5, max_running=32)
    tr = TrainerParams(t0=0.3, t_tok=1e-4, ranks=1, push_s=0.1)
    w = Workload(servers=2, prompts=6, responses=4, steps=10, warmup=1, prompt_len=8,
                 lengths='lognormal', median=60, tail=8.0, max_new_tokens=1000,
                 max_staleness=k, seed=3)
    r = simulate(eng, tr, w)
    assert r['sync'].staleness_max == 0
    assert r['k1'].staleness_max == 1
    for name in ('stream', 'stream_partial'):
        assert 0 < r[name].staleness_max <= k
        assert 0 < r[name].staleness_mean <= k


def test_equal_lengths_and_nothing_in_flight_at_a_push_give_stream_equal_to_partial() -> None:
    # Generation far faster than training: the pacing window is done before each push.
    eng = EngineParams(a=0.01, c=0.001, p=1e-4, max_running=64)
    tr = TrainerParams(t0=5.0, t_tok=0.0, ranks=1, push_s=0.3)
    r = simulate(eng, tr, _const(steps=6), ('stream', 'stream_partial'))
    assert r['stream'].step_times == pytest.approx(r['stream_partial'].step_times, abs=1e-9)
    assert r['stream'].step_s == pytest.approx(5.3, abs=1e-9)


def test_same_seed_same_result_other_seed_other_result() -> None:
    eng, tr = EngineParams(max_running=16), TrainerParams(ranks=2)
    w = Workload(servers=2, prompts=4, responses=4, steps=4, warmup=1, median=40,
                 max_new_tokens=400)
    one, two = simulate(eng, tr, w), simulate(eng, tr, w)
    other = simulate(eng, tr, Workload(**{**w.__dict__, 'seed': 7}))
    for name in one:
        assert one[name].step_times == two[name].step_times
    assert one['sync'].step_times != other['sync'].step_times


def test_calibrate_fits_the_lines_and_predict_gives_each_schedule() -> None:
    eng, tr = calibrate({'decode_step_s': {1: 0.0201, 9: 0.0209, 17: 0.0217},
                         'prefill_s': {100: 0.003, 300: 0.007}, 'ranks': 4,
                         'train_s': {1000: 2.5, 3000: 3.5}, 'push_s': 0.4})
    assert (eng.a, eng.c, eng.p) == pytest.approx((0.02, 1e-4, 2e-5))
    assert (tr.t0, tr.t_tok, tr.push_s) == pytest.approx((2.0, 0.002, 0.4))
    steps = predict(eng, tr, _const(), ('sync', 'k1'))
    assert steps['sync'] == pytest.approx(50 * (0.02 + 8e-4) + 8 * 10 * 2e-5 + 2.0
                                          + 0.002 * 8 * 60 / 4 + 0.4)
    assert steps['k1'] < steps['sync']


def test_cli_prints_a_line_per_schedule_and_the_areal_comparison() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, str(ROOT / 'benchmarks' / 'async_sim.py')]
    out = subprocess.run(cmd + ['--servers', '2', '--prompts', '4', '--responses', '4',
                                '--steps', '4', '--median', '50', '--max-new-tokens', '300'],
                         capture_output=True, text=True, env=env, timeout=120, check=True).stdout
    for name in ('sync', 'k1', 'stream', 'stream_partial'):
        assert re.search(rf'^schedule={name} +tokens_per_s=\d+\.\d step_s=\d+\.\d{{3}} '
                         r'ideal_step_s=\d+\.\d{3} speedup=\d\.\d{3} '
                         r'staleness_mean=\d\.\d{3} staleness_max=\d$', out, re.M), out
    out = subprocess.run(cmd + ['--preset', 'areal', '--steps', '3', '--warmup', '1',
                                '--prompts', '16', '--servers', '12', '--ranks', '4'],
                         capture_output=True, text=True, env=env, timeout=120, check=True).stdout
    assert re.search(r'^areal simulated_stream_partial_over_sync=\d+\.\d\d published=2\.57 ',
                     out, re.M), out
    assert 'colocated_sync=1' in out and 'not a measurement' in out


def test_lognormal_group_draws_one_length_per_group() -> None:
    from benchmarks.async_sim import draw_lengths
    w = Workload(prompts=2000, responses=4, steps=1, warmup=0, lengths='lognormal_group',
                 median=24, tail=10, max_new_tokens=10_000)
    rows = draw_lengths(w)
    assert (rows == rows[:, :1]).all()
    p50, p99 = np.percentile(rows[:, 0], [50, 99])
    assert 22 <= p50 <= 26 and 8 <= p99 / p50 <= 12
