"""GEPO in XTuner v1's RL trainer: runs the checks of ``xtuner_v1_env/`` in the v1 overlay.

XTuner v1 has the distribution name and version of the legacy xtuner this process
imports, so its checks run in a process of their own with the overlay that
``make xtuner-v1-deps`` installs first on PYTHONPATH (``make test`` sets it up when
the wheel is there).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHEEL_DIR = Path(os.environ.get('GEPO_XTUNER_V1_WHEEL_DIR',
                                ROOT.parent / 'shared' / 'wheels' / 'xtuner-v1-b934f462'))
DEPS = Path(os.environ.get('GEPO_XTUNER_V1_DEPS', ROOT / 'work_dirs' / 'xtuner_v1_deps'))


def test_import_gepo_xtuner_does_not_import_the_v1_integration():
    import gepo_xtuner  # noqa: F401

    assert not [m for m in sys.modules if m.startswith('gepo_xtuner.integrations.xtuner_v1')]


@pytest.mark.skipif(not any(WHEEL_DIR.glob('xtuner-*.whl')),
                    reason=f'no XTuner v1 wheel in {WHEEL_DIR} (XTuner v1 is not on PyPI)')
def test_gepo_in_xtuner_v1_trainer(tmp_path):
    if not (DEPS / '.installed').is_file():
        message = f'XTuner v1 overlay {DEPS} not installed: run `make xtuner-v1-deps`'
        if os.environ.get('GEPO_REQUIRE_XTUNER_V1') == '1':  # make test with the wheel present
            pytest.fail(message)
        pytest.skip(message)
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join(filter(None, [str(DEPS), str(ROOT),
                                                        os.environ.get('PYTHONPATH')])),
               XTUNER_DETERMINISTIC='false')  # v1 would ask for triton's deterministic mode
    proc = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-o',
         'python_files=check_*.py', '--basetemp', str(tmp_path / 'v1'),
         str(Path(__file__).parent / 'xtuner_v1_env')],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]
    assert ' passed' in proc.stdout and 'skipped' not in proc.stdout, proc.stdout[-2000:]
