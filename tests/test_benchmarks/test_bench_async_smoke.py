"""Smoke test of ``benchmarks/bench_async.py``: the LMDeploy setup (LMDeploy's own server
code with the CPU stand-in engine, a process of its own) runs both loops and prints both
medians and the ratio (no timing is asserted)."""

import os
import re
import sys
from pathlib import Path

from tests import preloaded

ROOT = Path(__file__).resolve().parents[2]


def test_bench_async_prints_both_loops_and_the_ratio(tmp_path: Path) -> None:
    proc = preloaded.run(
        [sys.executable, str(ROOT / 'benchmarks' / 'bench_async.py'), '--setup', 'lmdeploy',
         '--steps', '1', '--rounds', '1', '--tiny-dir', str(tmp_path / 'none'),
         '--lmdeploy-prompts', '4', '--lmdeploy-new-tokens', '4'],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
        timeout=600)
    assert proc.returncode == 0, f'{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}'
    for name in ('sync', 'async'):
        assert re.search(rf'lmdeploy {name} +median_s=\d+\.\d+ .*1 steps\)', proc.stdout)
    assert re.search(r'lmdeploy ratio_sync_over_async=\d+\.\d+', proc.stdout), proc.stdout
