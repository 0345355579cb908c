"""A tiny model directory and a runner for real ``python -m xtuner.tools.train`` runs."""

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import preloaded

ROOT = Path(__file__).resolve().parents[2]

# Small, fast settings for CI-sized machines (B=4 prompts x K=4 responses per step, two
# optimizer steps of several accumulated micro-batches each).
FAST = [
    'train_dataloader.batch_size=4', 'train_cfg.num_responses=4',
    'train_cfg.minibatch_responses_per_rank=8',
    'train_cfg.sampling.max_new_tokens=6', 'train_cfg.val.interval=2',
    # ~2-3 micro-batches per minibatch of 8 rows (prompts ~8 tokens, responses <= 6)
    'train_cfg.max_tokens_per_micro_batch=48',
    'default_hooks.checkpoint.interval=2', 'train_cfg.rewards.default.type=ShortAnswerReward',
]


@pytest.fixture(scope='session')
def tiny_dir(tmp_path_factory) -> Path:
    """A randomly initialised tiny policy plus small train/val files (no warm start)."""
    from gepo_xtuner.testbed.synthetic_tasks import build_task_files
    from gepo_xtuner.testbed.tiny import build_char_tokenizer, build_tiny_model
    out = tmp_path_factory.mktemp('tiny')
    tok = build_char_tokenizer()
    model = build_tiny_model(len(tok), seed=0)
    model.save_pretrained(out / 'model')
    tok.save_pretrained(out / 'model')
    build_task_files(out / 'data', n_train_per_domain=50, n_val_per_domain=4, seed=0)
    return out


def write_config(tmp_path: Path, base: str = 'gepo_tiny_cpu.py', extra: str = '') -> Path:
    """A user config on top of a shipped one, importing the test plugins."""
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(textwrap.dedent(f"""
        _base_ = ['{ROOT / 'configs' / base}']
        custom_imports = dict(imports=['gepo_xtuner', 'tests.test_engine.plugins'],
                              allow_failed_imports=False)
    """) + textwrap.dedent(extra))
    return cfg


def train(cfg: Path, work_dir: Path, tiny: Path, *options: str, launcher: list[str] | None = None,
          timeout: int = 600, check: bool = True, fresh: bool = False,
          cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Runs xtuner's training entry point for real and returns the finished process.

    The process is forked from a preloaded interpreter (``tests/preloaded.py``) unless
    ``fresh``: a test about what the console shows from the first import on asks for a
    fresh interpreter. ``cwd``: where the run starts (the checkout, as a developer's shell).
    """
    # the checkout first; packages installed beside the interpreter with --target stay found
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get('PYTHONPATH'))))
    env = dict(os.environ, GEPO_TINY_DIR=str(tiny), PYTHONPATH=path)
    env.pop('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', None)  # as a user's shell: torch's default loads
    cmd = (launcher or [sys.executable, '-m', 'xtuner.tools.train']) + [
        str(cfg), '--work-dir', str(work_dir), '--cfg-options', *FAST, *options]
    if fresh:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd,
                              timeout=timeout, check=False)
    else:
        proc = preloaded.run(cmd, env=env, cwd=cwd, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f'exit {proc.returncode}\n{proc.stdout[-4000:]}\n'
                             f'{proc.stderr[-6000:]}')
    return proc


def free_port() -> int:
    """A TCP port nobody listens on now (tests may run beside other distributed jobs)."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def train_ranks(cfg: Path, work_dir: Path, tiny: Path, nproc: int, *options: str,
                deps: Path | None = None, fast: bool = True, timeout: int = 900,
                launcher: str = 'forked') -> str:
    """``nproc`` gloo processes of XTuner's training program; returns their output.

    ``launcher='xtuner'``: through ``xtuner train`` with ``NPROC_PER_NODE`` (XTuner's
    launcher, then torchrun), as a user starts it. ``'forked'``: the same program and
    arguments (``--launcher pytorch``) in ``nproc`` processes forked from the preloaded
    interpreter with the environment torchrun gives its workers (tests/preloaded.py); the
    ranks, gloo and every collective are as real, only the launcher's start-up is saved.
    ``xtuner train`` exits 0 even when training fails: callers judge by what the run left
    behind. ``deps``: a directory put first on PYTHONPATH (DeepSpeed's overlay; its ranks
    fork from a zygote that imported DeepSpeed), its ``torch_extensions/`` holding the
    collective ``make deepspeed-deps`` compiled.
    """
    bin_dir = Path(sys.executable).parent
    path = f'{deps}{os.pathsep}{ROOT}' if deps else str(ROOT)
    env = dict(os.environ, GEPO_TINY_DIR=str(tiny), PYTHONPATH=path, NPROC_PER_NODE=str(nproc),
               PORT=str(free_port()), OMP_NUM_THREADS='1', DS_ACCELERATOR='cpu',
               PATH=f'{bin_dir}{os.pathsep}{os.environ.get("PATH", "")}')
    if deps:
        env['TORCH_EXTENSIONS_DIR'] = str(Path(deps) / 'torch_extensions')
    env.pop('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', None)
    args = [str(cfg), '--work-dir', str(work_dir), '--cfg-options', *(FAST if fast else []),
            *options]
    if launcher == 'forked':
        import xtuner.tools.train as program
        out = preloaded.run_ranks(program.__file__, [*args, '--launcher', 'pytorch'], nproc,
                                  env=dict(env, MASTER_PORT=env['PORT']), cwd=ROOT,
                                  timeout=timeout)
        if out is not None:
            return out
    elif launcher not in ('forked', 'xtuner'):
        raise ValueError(f"launcher: 'forked' or 'xtuner', not {launcher!r}")
    xtuner = shutil.which('xtuner', path=str(bin_dir)) or shutil.which('xtuner')
    assert xtuner, 'the xtuner console script is not installed'
    proc = subprocess.run([xtuner, 'train', *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout)
    return proc.stdout + proc.stderr


def scalars(work_dir: Path) -> dict[int, dict[str, float]]:
    """Logged training scalars by step, merged over the run's scalar files."""
    out: dict[int, dict[str, float]] = {}
    for path in sorted(work_dir.glob('*/vis_data/scalars.json')):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            out.setdefault(row.pop('step'), {}).update(row)
    return out
