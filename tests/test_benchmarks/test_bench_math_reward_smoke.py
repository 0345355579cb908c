"""Smoke test of ``benchmarks/bench_math_reward.py``: it runs, scores its cases right and
prints its figures as the last line's JSON (no timing is asserted)."""

import json
import os
import sys
from pathlib import Path

from tests import preloaded

ROOT = Path(__file__).resolve().parents[2]


def test_bench_math_reward_prints_its_figures() -> None:
    proc = preloaded.run(
        [sys.executable, str(ROOT / 'benchmarks' / 'bench_math_reward.py'), '--calls', '4'],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
        timeout=300)
    assert proc.returncode == 0, f'{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}'
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(figures) == {'first_call_s', 'warm_check_s', 'startup_s'}
    assert 0 < figures['warm_check_s'] < figures['first_call_s']
    assert figures['startup_s'] == figures['first_call_s'] - figures['warm_check_s']
