"""Smoke test of ``benchmarks/bench_async.py --setup longtail``: a real ``vllm serve``
(launched by the benchmark), imposed long-tailed lengths, one timed step of one round of
the one-batch-ahead and partial-rollout schedules; checks the printed lines (no timing is
asserted). Skips where vLLM's CPU build (``make vllm-env``) is missing. Marked ``slow``
(about two minutes, most of it starting its own server): ``make test-all`` runs it,
``make test`` does not."""

import os
import re
import sys
from pathlib import Path

import pytest

from tests import preloaded

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_longtail_prints_each_schedule_the_ratio_and_the_simulation(vllm_env) -> None:
    proc = preloaded.run(
        [sys.executable, str(ROOT / 'benchmarks' / 'bench_async.py'), '--setup', 'longtail',
         '--steps', '1', '--rounds', '1', '--vllm-python', str(vllm_env / 'bin' / 'python'),
         '--longtail-prompts', '2', '--longtail-responses', '2', '--longtail-median', '6',
         '--longtail-cap', '24', '--longtail-epochs', '1', '--longtail-calib-tokens', '8',
         '--longtail-variants', 'k1', 'stream_partial'],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
        timeout=600)
    assert proc.returncode == 0, f'{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}'
    out = proc.stdout
    assert re.search(r'longtail lengths: log-normal median 6, .* p99 \d+', out), out
    for name in ('k1', 'stream_partial'):
        assert re.search(rf'longtail {name} +median_step_s=\d+\.\d+ .*trained_tok_per_s='
                         rf'\d+\.\d+ ideal_tok_per_s=\d+\.\d+ .*\(1 steps\)', out), out
        assert re.search(rf'longtail sim {name} +predicted_step_s=\d+\.\d+ '
                         r'measured_step_s=\d+\.\d+ error=[-+]\d', out), out
    assert re.search(r'longtail ratio_stream_partial_over_k1=\d+\.\d+', out), out
