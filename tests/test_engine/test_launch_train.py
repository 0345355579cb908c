"""``gepo-train`` with XTuner's real training program: exit status and a killed launcher."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import FAST, ROOT, write_config

GEPO_TRAIN = Path(sys.executable).parent / 'gepo-train'  # the installed console script


def children(pid: int) -> list[int]:
    out = []
    for stat in Path('/proc').glob('[0-9]*/stat'):
        try:
            fields = stat.read_text().rsplit(')', 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def running(pid: int) -> bool:
    try:
        return Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0] != 'Z'
    except FileNotFoundError:
        return False


def test_a_failing_run_exits_non_zero_without_python_on_path(tmp_path, tiny_dir):
    """`xtuner train` would need `python` on PATH here, and exit 0 anyway."""
    assert GEPO_TRAIN.is_file(), "pip install -e . installs the gepo-train console script"
    cfg = write_config(tmp_path, extra="train_cfg = dict(rewards=dict(default=dict("
                                       "type='NoSuchReward')))\n")
    env = dict(PATH='/usr/bin:/bin', HOME=os.environ.get('HOME', '/tmp'), OMP_NUM_THREADS='1',
               GEPO_TINY_DIR=str(tiny_dir), PYTHONPATH=str(ROOT))
    proc = subprocess.run([str(GEPO_TRAIN), str(cfg), '--work-dir', str(tmp_path / 'w')],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert 'NoSuchReward' in proc.stderr
    assert proc.stderr.startswith(f'gepo-train: {sys.executable} -m xtuner.tools.train {cfg}')


@pytest.mark.skipif(sys.platform != 'linux', reason='PR_SET_PDEATHSIG is Linux only')
def test_sigkill_of_the_launcher_stops_a_training_run(tmp_path, tiny_dir):
    """A real run that would go on for minutes: killing the launcher ends it, no more saves."""
    work = tmp_path / 'w'
    env = dict(os.environ, GEPO_TINY_DIR=str(tiny_dir), PYTHONPATH=str(ROOT),
               OMP_NUM_THREADS='1')
    with open(tmp_path / 'out.log', 'w') as log:
        launcher = subprocess.Popen(
            [sys.executable, '-m', 'gepo_xtuner_launch', str(write_config(tmp_path)),
             '--work-dir', str(work), '--cfg-options', *FAST, 'train_cfg.max_steps=100000',
             'default_hooks.checkpoint.interval=1'],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while not list(work.glob('iter_*.pth')):  # training is under way and saving
            assert launcher.poll() is None, (tmp_path / 'out.log').read_text()[-3000:]
            assert time.monotonic() < deadline, 'no checkpoint after 240 s'
            time.sleep(0.2)
        (child,) = children(launcher.pid)
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
    deadline = time.monotonic() + 60
    while running(child):
        assert time.monotonic() < deadline, 'training still running 60 s after the kill'
        time.sleep(0.1)
    saved = sorted(p.name for p in work.glob('*.pth'))
    time.sleep(3)
    assert sorted(p.name for p in work.glob('*.pth')) == saved  # nothing trains on
