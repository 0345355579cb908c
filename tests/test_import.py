"""``import gepo_xtuner`` in an ordinary process changes nothing outside the package."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_has_no_side_effects():
    """No matplotlib (hence no backend chosen), no environment variable, no testbed module,
    and every extension point registered."""
    code = (
        'import os, sys, gepo_xtuner\n'
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported'\n"
        "assert 'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD' not in os.environ\n"
        "fixtures = [m for m in sys.modules if m.startswith('gepo_xtuner.testbed')]\n"
        "assert not fixtures, fixtures\n"
        "assert 'GEPOAdvantage' in gepo_xtuner.ADVANTAGES.module_dict\n"
        "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if k != 'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD'}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == 'ok', proc.stderr[-2000:]


def test_shims_act_only_in_xtuners_train_process(monkeypatch, tmp_path):
    """The same call in xtuner's training program with --resume sets the variable."""
    from gepo_xtuner.compat import WEIGHTS_ONLY_ENV, apply_xtuner_train_shims

    monkeypatch.setenv(WEIGHTS_ONLY_ENV, 'unset')
    monkeypatch.delenv(WEIGHTS_ONLY_ENV)
    apply_xtuner_train_shims(['/usr/bin/python', 'train.py', '--resume', 'x.pth'])
    assert WEIGHTS_ONLY_ENV not in os.environ
    train = '/venv/lib/python3.11/site-packages/xtuner/tools/train.py'
    apply_xtuner_train_shims([train, 'cfg.py', '--resume', str(tmp_path / 'missing.pth')])
    assert os.environ.get(WEIGHTS_ONLY_ENV) == '1'
