"""Smoke test of ``benchmarks/bench_code_reward.py``: it runs, every response passes, and it
prints a row per setting and the figures as the last line's JSON (no timing is asserted)."""

import json
import os
import sys
from pathlib import Path

from tests import preloaded

ROOT = Path(__file__).resolve().parents[2]


def test_bench_code_reward_prints_each_setting() -> None:
    proc = preloaded.run(
        [sys.executable, str(ROOT / 'benchmarks' / 'bench_code_reward.py'), '--responses', '4',
         '--workers', '1', '2', '--rounds', '1'],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
        timeout=300)
    assert proc.returncode == 0, f'{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}'
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(figures) == {'1', '2'}
    assert figures['1']['speedup'] == 1.0
    for row in figures.values():
        assert row['wall_ms_per_response'] > 0 and row['trainer_cpu_ms_per_response'] >= 0
    assert 'batch_workers=2:' in proc.stdout
