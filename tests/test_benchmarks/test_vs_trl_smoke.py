"""Smoke test of ``benchmarks/vs_trl.py``: its own-loop half runs (TRL is not installed in CI)."""

import os
import sys
from pathlib import Path

from tests import preloaded

ROOT = Path(__file__).resolve().parents[2]


def test_vs_trl_own_loop_runs(tmp_path: Path) -> None:
    from gepo_xtuner.testbed.synthetic_tasks import build_task_files
    from gepo_xtuner.testbed.tiny import build_char_tokenizer, build_tiny_model
    tiny = tmp_path / 'tiny'
    tok = build_char_tokenizer()
    build_tiny_model(len(tok), seed=0).save_pretrained(tiny / 'model')
    tok.save_pretrained(tiny / 'model')
    build_task_files(tiny / 'data', n_train_per_domain=8, n_val_per_domain=2, seed=0)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop('GEPO_TINY_DIR', None)
    proc = preloaded.run(
        [sys.executable, str(ROOT / 'benchmarks' / 'vs_trl.py'), '--skip-trl', '--steps', '1',
         '--rounds', '1', '--warmup', '0', '--tiny-dir', str(tiny),
         '--work-dir', str(tmp_path / 'work')],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, f'{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}'
    lines = proc.stdout.strip().splitlines()
    assert any(line.startswith('ours  steps=1 ') for line in lines), proc.stdout
    assert not any(line.startswith('trl ') for line in lines)
    assert lines[-1] == 'ratio_trl_over_ours_step_time=nan'
