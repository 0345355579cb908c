"""Smoke test of ``benchmarks/bench_rl_step.py`` on a very small model (TRL skipped)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_rl_step_prints_every_variant_and_the_ratios(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / 'benchmarks' / 'bench_rl_step.py'), '--skip-trl',
         '--responses', '6', '--median-length', '8', '--max-length', '32', '--hidden', '64',
         '--layers', '1', '--vocab', '128', '--max-tokens', '64', '--rounds', '1',
         '--work-dir', str(tmp_path)],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
        timeout=300)
    assert proc.returncode == 0, f'{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}'
    lines = proc.stdout.strip().splitlines()
    for name in ('floor', 'ours', 'padded'):
        assert any(re.match(rf'{name} +median_s=\S+ .* tokens_per_s=\d+ +peak_extra_mib=\d+',
                            line) for line in lines), (name, proc.stdout)
    assert re.fullmatch(r'ratio_ours_over_floor=\d+\.\d+ ratio_padded_over_ours=\d+\.\d+ '
                        r'ratio_trl_over_ours=nan', lines[-1]), lines[-1]
