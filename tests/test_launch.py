"""``gepo-train`` (gepo_xtuner_launch.py): the command it builds, signals, exit status, kills.

Real processes throughout: the launcher runs in its own interpreter and its child is a
small Python program that records the signals it gets. Real xtuner training runs under
the launcher are in ``tests/test_engine/test_launch_train.py``.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gepo_xtuner_launch import LaunchError, build_command

ROOT = Path(__file__).resolve().parents[1]
PY = 'py'
TRAIN = [PY, '-m', 'xtuner.tools.train']


def test_one_process_runs_xtuners_training_program_with_this_interpreter():
    assert build_command(['c.py', '--work-dir', 'w'], env={}, python=PY) == [
        *TRAIN, 'c.py', '--work-dir', 'w']
    assert build_command(['c.py'], env={'NNODES': '1', 'NPROC_PER_NODE': '1'},
                         python=PY) == [*TRAIN, 'c.py']
    assert build_command(['c.py'], env={})[0] == sys.executable


def test_several_processes_run_under_torchrun_with_xtuners_environment_names():
    env = {'NPROC_PER_NODE': '4', 'NNODES': '2', 'NODE_RANK': '1', 'ADDR': 'nodeA',
           'PORT': '29600'}
    assert build_command(['c.py', '--deepspeed', 'deepspeed_zero2'], env=env, python=PY) == [
        PY, '-m', 'torch.distributed.run', '--nnodes=2', '--node_rank=1', '--nproc_per_node=4',
        '--master_addr=nodeA', '--master_port=29600', '-m', 'xtuner.tools.train', 'c.py',
        '--deepspeed', 'deepspeed_zero2', '--launcher', 'pytorch']
    # torchrun's names work too; launcher options before CONFIG win over the environment
    cmd = build_command(['--nproc-per-node=2', '--master-port', '29700', 'c.py'],
                        env={'NPROC_PER_NODE': '8', 'MASTER_ADDR': 'h', 'MASTER_PORT': '1'},
                        python=PY)
    assert cmd[3:8] == ['--nnodes=1', '--node_rank=0', '--nproc_per_node=2', '--master_addr=h',
                        '--master_port=29700']
    # one node without a port: a random one, as `xtuner train` picks
    port = int(build_command(['c.py'], env={'NPROC_PER_NODE': '2'}, python=PY)[7].split('=')[1])
    assert 20000 <= port <= 29999


def test_slurm_and_an_explicit_launcher_are_respected():
    env = {'NPROC_PER_NODE': '8'}
    assert build_command(['c.py', '--launcher', 'slurm'], env=env, python=PY) == [
        *TRAIN, 'c.py', '--launcher', 'slurm']
    cmd = build_command(['c.py', '--launcher=pytorch'], env=dict(env, PORT='2'), python=PY)
    assert cmd[-3:] == ['xtuner.tools.train', 'c.py', '--launcher=pytorch']


@pytest.mark.parametrize('argv, env, message', [
    ([], {}, 'no CONFIG given; usage: gepo-train'),
    (['c.py'], {'NPROC_PER_NODE': 'eight'}, "NPROC_PER_NODE must be a positive integer, "
                                            "got 'eight'"),
    (['--nnodes', '0', 'c.py'], {}, "--nnodes / NNODES must be a positive integer, got '0'"),
    (['c.py'], {'NNODES': '2', 'NODE_RANK': '2', 'PORT': '1'}, 'NODE_RANK must be in 0..1'),
    (['c.py'], {'NNODES': '2'}, '2 nodes need one rendezvous port: set --master-port'),
    (['c.py'], {'NPROC_PER_NODE': '2', 'PORT': 'x'}, "PORT must be a positive integer, got 'x'"),
])
def test_bad_settings_say_what_to_fix(argv, env, message):
    with pytest.raises(LaunchError, match=message.replace('.', r'\.')):
        build_command(argv, env=env, python=PY)


# A child that records the signals it receives, then exits with 100 + the signal number.
RECORDER = textwrap.dedent("""
    import os, signal, sys, time
    log = sys.argv[1]
    def record(signum, frame):
        with open(log, 'a') as fh:
            fh.write(f'{signum} pgid={os.getpgid(0)}\\n')
        sys.exit(100 + signum)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, record)
    with open(log, 'a') as fh:
        fh.write(f'ready {os.getpid()}\\n')
    time.sleep(120)
    sys.exit(7)
""")


def launch(tmp_path: Path, child: list[str]) -> subprocess.Popen:
    """The launcher's ``run`` in its own interpreter, exiting with what ``run`` returns."""
    code = f'import sys; from gepo_xtuner_launch import run; sys.exit(run({child!r}))'
    return subprocess.Popen([sys.executable, '-c', code], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f'timed out after {timeout} s waiting for {what}'
        time.sleep(0.05)


def ready_pid(log: Path) -> int | None:
    lines = log.read_text().splitlines() if log.exists() else []
    return next((int(line.split()[1]) for line in lines if line.startswith('ready')), None)


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody has reaped yet."""
    try:
        return Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0] == 'Z'
    except FileNotFoundError:
        return True


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_reach_the_child_once_and_its_status_is_returned(tmp_path, sig):
    log = tmp_path / 'signals.log'
    launcher = launch(tmp_path, [sys.executable, '-c', RECORDER, str(log)])
    child = wait_for(lambda: ready_pid(log), 60, 'the child to start')
    launcher.send_signal(sig)
    assert launcher.wait(timeout=30) == 100 + sig
    received = [line for line in log.read_text().splitlines() if not line.startswith('ready')]
    # once, and in the child's own process group (a terminal's Ctrl-C reaches it once too)
    assert received == [f'{int(sig)} pgid={child}']


def test_exit_status_and_death_by_signal_are_returned(tmp_path):
    code = 'import sys; from gepo_xtuner_launch import run; sys.exit(run(sys.argv[1:]))'
    for child, status in ((['-c', 'raise SystemExit(3)'], 3), (['-c', 'pass'], 0),
                          (['-c', 'import os; os.kill(os.getpid(), 9)'], 128 + 9)):
        proc = subprocess.run([sys.executable, '-c', code, sys.executable, *child], cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)), check=False,
                              timeout=60)
        assert proc.returncode == status, child


@pytest.mark.skipif(sys.platform != 'linux', reason='PR_SET_PDEATHSIG is Linux only')
def test_sigkill_of_the_launcher_stops_the_child(tmp_path):
    log = tmp_path / 'signals.log'
    launcher = launch(tmp_path, [sys.executable, '-c', RECORDER, str(log)])
    child = wait_for(lambda: ready_pid(log), 60, 'the child to start')
    launcher.kill()
    launcher.wait(timeout=30)
    wait_for(lambda: gone(child), 30, 'the orphaned child to exit')
    assert f'{int(signal.SIGTERM)} pgid={child}' in log.read_text()  # the parent-death signal


@pytest.mark.skipif(sys.platform != 'linux', reason='PR_SET_PDEATHSIG is Linux only')
def test_sigkill_of_the_launcher_stops_torchruns_workers(tmp_path):
    """The distributed chain: launcher killed -> torchrun gets SIGTERM -> it stops its workers."""
    log = tmp_path / 'signals.log'
    worker = tmp_path / 'worker.py'
    worker.write_text(RECORDER)
    launcher = launch(tmp_path, [sys.executable, '-m', 'torch.distributed.run', '--nnodes=1',
                                 '--nproc_per_node=1', '--master_port=0', str(worker),
                                 str(log)])
    pid = wait_for(lambda: ready_pid(log), 120, 'torchrun to start its worker')
    launcher.kill()
    launcher.wait(timeout=30)
    wait_for(lambda: gone(pid), 60, "torchrun's worker to exit")
