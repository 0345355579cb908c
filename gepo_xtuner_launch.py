"""``gepo-train``: XTuner's training program, launched so that failures and kills propagate.

``xtuner train CONFIG`` (xtuner 0.2.0) starts ``python .../xtuner/tools/train.py`` from
``PATH`` and always exits 0, also when training crashed; killing it with SIGKILL leaves
the training process running. ``gepo-train CONFIG [train args...]`` runs the same
program with the interpreter it was started with and:

* exits with the training program's status (128 + N when the program died of signal N);
* forwards SIGINT, SIGTERM and SIGHUP to the program's process group (torchrun passes
  them on to its workers);
* on Linux, makes the program receive SIGTERM when the launcher dies, even of SIGKILL
  (``prctl(PR_SET_PDEATHSIG)``); under torchrun, torchrun then stops its workers.

Processes, as ``xtuner train`` chooses them: with ``NNODES`` and ``NPROC_PER_NODE`` unset
or 1, or with ``--launcher slurm`` among the train args, one process runs ``python -m
xtuner.tools.train CONFIG ...``; otherwise torchrun (``python -m torch.distributed.run``)
starts ``NPROC_PER_NODE`` processes with ``--launcher pytorch``. The rendezvous comes from
the launcher options before ``CONFIG`` (``--nnodes``, ``--node-rank``,
``--nproc-per-node``, ``--master-addr``, ``--master-port``) or the environment: xtuner's
names ``NNODES``, ``NODE_RANK``, ``NPROC_PER_NODE``, ``ADDR``, ``PORT``, and torchrun's
``MASTER_ADDR``, ``MASTER_PORT``. Without a port a single node picks a random one, as
``xtuner train`` does; several nodes must agree on one, so there it is an error.

The training program runs in its own process group, so a Ctrl-C in the terminal reaches
it once, through the launcher.

This module is top-level, outside the ``gepo_xtuner`` package, because importing any
``gepo_xtuner`` submodule runs the package's ``__init__`` (torch, mmengine,
transformers: seconds and hundreds of MB), which a process that only waits for its
child should not pay.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

__all__ = ['FORWARDED_SIGNALS', 'LaunchError', 'build_command', 'main', 'run']

#: Signals the launcher passes on to the training program's process group.
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: What the training program receives when the launcher dies (Linux only).
PARENT_DEATH_SIGNAL = signal.SIGTERM
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
TRAIN_MODULE = 'xtuner.tools.train'
USAGE = ('gepo-train [--nnodes N] [--node-rank R] [--nproc-per-node P] [--master-addr HOST] '
         '[--master-port PORT] CONFIG [train args...]')


class LaunchError(ValueError):
    """The launch settings are unusable; the message says which one and how to fix it."""


def _positive(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise LaunchError(f'{name} must be a positive integer, got {value!r}')
    return number


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='gepo-train', usage=USAGE,
        description=__doc__.split('\n\n')[1].replace('``', '`'),
        epilog='Train args after CONFIG go to xtuner\'s training program unchanged '
               '(--work-dir, --resume, --cfg-options, --deepspeed, --launcher, ...); '
               '`gepo-train CONFIG --help` lists them.')
    parser.add_argument('--nnodes', help='nodes (default: $NNODES, else 1)')
    parser.add_argument('--node-rank', help="this node's rank (default: $NODE_RANK, else 0)")
    parser.add_argument('--nproc-per-node',
                        help='processes on this node (default: $NPROC_PER_NODE, else 1)')
    parser.add_argument('--master-addr',
                        help='host of node rank 0 (default: $ADDR, $MASTER_ADDR, else 127.0.0.1)')
    parser.add_argument('--master-port',
                        help='rendezvous port (default: $PORT, $MASTER_PORT, else a random '
                             'port on a single node)')
    return parser


def _split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Launcher options (before CONFIG) and CONFIG with the train args."""
    options = {a.option_strings[0] for a in _parser()._actions if a.option_strings
               and a.option_strings[0] != '-h'}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ('-h', '--help'):
            i += 1
        elif arg.split('=', 1)[0] in options:
            i += 1 if '=' in arg else 2
        else:
            break
    return list(argv[:i]), list(argv[i:])


def build_command(argv: Sequence[str], env: Mapping[str, str] | None = None,
                  python: str | None = None) -> list[str]:
    """The training command ``gepo-train`` runs for its arguments.

    Args:
        argv: launcher options, then ``CONFIG`` and the train args.
        env: environment to read ``NNODES`` and the rest from (default ``os.environ``).
        python: interpreter of the training program (default ``sys.executable``).

    Returns:
        ``[python, '-m', 'xtuner.tools.train', CONFIG, ...]``, or the same program under
        ``python -m torch.distributed.run`` with ``--launcher pytorch`` appended (unless
        the train args name a launcher).

    Raises:
        LaunchError: no CONFIG, a count that is not a positive integer, a node rank out
            of range, or several nodes without a port.
    """
    env = os.environ if env is None else env
    python = python or sys.executable
    leading, rest = _split(argv)
    opts = _parser().parse_args(leading)
    if not rest:
        raise LaunchError(f'no CONFIG given; usage: {USAGE}')
    train_args = rest
    launcher = next((train_args[i + 1] for i, a in enumerate(train_args[:-1])
                     if a == '--launcher'), None)
    launcher = launcher or next((a.split('=', 1)[1] for a in train_args
                                 if a.startswith('--launcher=')), None)
    nnodes = _positive('--nnodes / NNODES', opts.nnodes or env.get('NNODES') or '1')
    nproc = _positive('--nproc-per-node / NPROC_PER_NODE',
                      opts.nproc_per_node or env.get('NPROC_PER_NODE') or '1')
    if launcher == 'slurm' or (nnodes == 1 and nproc == 1):
        return [python, '-m', TRAIN_MODULE, *train_args]
    rank_text = opts.node_rank or env.get('NODE_RANK') or '0'
    if not rank_text.isdigit() or int(rank_text) >= nnodes:
        raise LaunchError(f'--node-rank / NODE_RANK must be in 0..{nnodes - 1}, got '
                          f'{rank_text!r}')
    addr = opts.master_addr or env.get('ADDR') or env.get('MASTER_ADDR') or '127.0.0.1'
    port = opts.master_port or env.get('PORT') or env.get('MASTER_PORT')
    if port is None:
        if nnodes > 1:
            raise LaunchError(f'{nnodes} nodes need one rendezvous port: set --master-port '
                              '(or PORT / MASTER_PORT) to the same free port on every node')
        port = str(random.randint(20000, 29999))  # as `xtuner train` does
    _positive('--master-port / PORT', port)
    torchrun = [python, '-m', 'torch.distributed.run', f'--nnodes={nnodes}',
                f'--node_rank={int(rank_text)}', f'--nproc_per_node={nproc}',
                f'--master_addr={addr}', f'--master_port={port}']
    tail = [] if launcher else ['--launcher', 'pytorch']
    return [*torchrun, '-m', TRAIN_MODULE, *train_args, *tail]


def _child_setup(parent: int) -> Callable[[], None]:
    """What the child runs between fork and exec: own process group, parent-death signal."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == 'linux' else None
    except (OSError, AttributeError):
        prctl = None

    def setup() -> None:
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL), 0, 0, 0)
            if os.getppid() != parent:  # the launcher died before prctl took effect
                os.kill(os.getpid(), PARENT_DEATH_SIGNAL)

    return setup


def run(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """Runs ``cmd`` as the launcher's child and returns its exit status.

    The child gets its own process group; SIGINT, SIGTERM and SIGHUP sent to this
    process are sent on to that group; on Linux the child receives SIGTERM when this
    process dies, even of SIGKILL. Signal handlers are restored before returning.

    Args:
        cmd: the program and its arguments.
        env: the child's environment (default: this process's).

    Returns:
        The child's exit status, or 128 + N if it died of signal N.
    """
    child = subprocess.Popen(list(cmd), env=None if env is None else dict(env),
                             preexec_fn=_child_setup(os.getpid()))

    def forward(signum: int, _frame) -> None:
        if child.returncode is None:
            try:
                os.killpg(child.pid, signum)
            except ProcessLookupError:  # the group is gone: the child has exited
                pass

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        status = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - status if status < 0 else status


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``gepo-train``; returns the training program's exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        cmd = build_command(argv)
    except LaunchError as exc:
        print(f'gepo-train: error: {exc}', file=sys.stderr)
        return 2
    print(f'gepo-train: {shlex.join(cmd)}', file=sys.stderr, flush=True)
    return run(cmd)


if __name__ == '__main__':
    sys.exit(main())
