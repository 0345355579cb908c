"""GEPO in verl 0.9.1: runs the checks of ``verl_env/`` in verl's environment.

verl pins transformers 5.5.3-5.10, which the legacy xtuner of this environment cannot use, so
its checks run in a process of their own with ``make verl-deps``'s overlay first on
PYTHONPATH (``make test`` installs it), where ``import verl`` finds this package's
``verl.plugins`` entry point in this environment's metadata, as in a user's.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_gepo_xtuner_does_not_import_the_verl_integration():
    import gepo_xtuner  # noqa: F401

    assert 'gepo_xtuner.integrations.verl' not in sys.modules


def test_gepo_as_verls_advantage_estimator(verl_deps, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        str(verl_deps), str(ROOT), os.environ.get('PYTHONPATH')])))
    proc = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-W', 'ignore',
         '-o', 'python_files=check_*.py', '--basetemp', str(tmp_path / 'verl'),
         str(Path(__file__).parent / 'verl_env')],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]
    assert ' passed' in proc.stdout and 'skipped' not in proc.stdout, proc.stdout[-2000:]
