"""Smoke tests of the benchmarks docs/cluster.md quotes, at the smallest sizes.

``bench_server_pool.py`` runs its pools of LMDeploy protocol doubles (real HTTP on
loopback, not LMDeploy) and ``bench_rank_state_gather.py`` real gloo processes; the
figures themselves are not checked, only that each benchmark runs from a checkout and
prints every row.
"""

import os
import re
import sys
from pathlib import Path

from tests import preloaded

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    proc = preloaded.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS='1'),
                         timeout=300)
    assert proc.returncode == 0, f'{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}'
    return proc.stdout


def test_bench_server_pool_prints_every_pool_size_and_loses_no_request() -> None:
    out = _run('benchmarks/bench_server_pool.py', '--requests', '8', '--delay-s', '0.01',
               '--repeats', '1')
    rows = re.findall(r'^ +(\d) \| +\S+ s \| +\S+ \| *(.*)$', out, flags=re.M)
    assert [n for n, _ in rows] == ['1', '2', '4'], out
    assert all(stopped.endswith('(8 answered)') for n, stopped in rows if n != '1'), out


def test_bench_rank_state_gather_prints_each_world_size() -> None:
    out = _run('benchmarks/bench_rank_state_gather.py', '--ranks', '2', '--repeats', '3')
    size, ms = re.search(r'^ +2 \| +(\d+) \| +(\S+)$', out, flags=re.M).groups()
    assert int(size) > 1000 and float(ms) > 0, out
