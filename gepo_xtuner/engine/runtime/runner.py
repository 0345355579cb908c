"""An mmengine Runner that trains on CPU-only data-parallel machines and loads its own checkpoints."""

import logging
import os
import pickle
import warnings
import zipfile
from contextlib import contextmanager
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from mmengine.dist import is_main_process
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from ..state.fileio import (CheckpointError, checkpoint_problem, remove_stale_temporaries,
                            unreadable_checkpoint_message)

#: Console messages of mmengine that say nothing about the run (kept in the log file):
#: its CheckpointHook always builds a deprecated FileClient, and it warns at every save
#: that there are no parameter schedulers to save.
CONSOLE_NOISE = ('"FileClient" will be deprecated in future',
                 '"HardDiskBackend" is the alias of "LocalBackend"',
                 '`save_param_scheduler` is True but `self.param_schedulers` is None',
                 '`resume_param_scheduler` is True but `self.param_schedulers` is None',
                 # the RL loop draws prompts from a restarting iterator on purpose
                 'Reach the end of the dataloader, it will be restarted')
#: Third-party loggers' messages that say nothing to the user of an RL run, dropped:
#: transformers 4.4x announces at the first ``generate`` a change of its return type
#: that the rollout code does not depend on.
THIRD_PARTY_NOISE = {'transformers.generation.utils': ('From v4.47 onwards, when a model cache',)}
#: torch's warning at every load under TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (twice per resume,
#: xtuner's seed load and the runner's); the logged notice of compat.py says it once.
WEIGHTS_ONLY_WARNING = 'Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected'


class PrefixFilter(logging.Filter):
    """Drops the records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def quiet_third_party() -> None:
    """Adds a :class:`PrefixFilter` for :data:`THIRD_PARTY_NOISE` to each of its loggers
    (once per process)."""
    for name, prefixes in THIRD_PARTY_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, PrefixFilter) for f in logger.filters):
            logger.addFilter(PrefixFilter(prefixes))


class ConsoleFilter(logging.Filter):
    """Keeps the console to what a user reads; the log file still gets every record.

    While ``quiet`` is set (the runner's construction) INFO records are dropped: the
    system and runtime environment, the whole config and the hook table, about 220
    lines. Messages starting with one of :data:`CONSOLE_NOISE` are always dropped.
    """

    def __init__(self, quiet: bool) -> None:
        super().__init__()
        self.quiet = quiet

    def filter(self, record: logging.LogRecord) -> bool:
        if self.quiet and record.levelno <= logging.INFO:
            return False
        return not str(record.msg).startswith(CONSOLE_NOISE)


@contextmanager
def trusted_checkpoint_load() -> Iterator[None]:
    """Lets ``torch.load`` unpickle mmengine checkpoints (torch >= 2.6 refuses by default).

    mmengine checkpoints hold pickled objects (message-hub buffers, config);
    ``torch.load(weights_only=True)``, torch's default since 2.6, rejects them.
    Unpickling runs code from the file: resume only from checkpoints you trust.
    Scoped to the load; the process-wide default is restored afterwards.
    """
    name = 'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD'
    old = os.environ.get(name)
    os.environ[name] = '1'
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings('ignore', message=WEIGHTS_ONLY_WARNING)
            yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def init_cpu_process_group(launcher: str, env_cfg: dict) -> None:
    """Initialises the default process group on a machine without CUDA (else nothing).

    mmengine's ``init_dist`` calls ``torch.cuda.set_device`` unconditionally; a group
    that already exists is left alone by it. Backend: ``env_cfg.dist_cfg.backend``,
    ``gloo`` if unset; ``env://`` rendezvous as torchrun or Slurm set it up.
    """
    if torch.cuda.is_available() or dist.is_initialized():
        return
    backend = (env_cfg.get('dist_cfg') or {}).get('backend', 'gloo')
    if launcher == 'slurm':
        os.environ.setdefault('RANK', os.environ['SLURM_PROCID'])
        os.environ.setdefault('WORLD_SIZE', os.environ['SLURM_NTASKS'])
        os.environ.setdefault('LOCAL_RANK', os.environ['SLURM_LOCALID'])
    dist.init_process_group(backend=backend, init_method='env://')


@RUNNERS.register_module()
class RLRunner(Runner):
    """mmengine's Runner with two changes for RL runs of this package.

    - Distributed launch on machines without CUDA: mmengine's ``init_dist`` calls
      ``torch.cuda.set_device`` unconditionally; when CUDA is unavailable this
      runner initialises the process group itself (``gloo`` unless
      ``env_cfg.dist_cfg.backend`` says otherwise, ``env://`` rendezvous as
      torchrun/slurm set it up) before mmengine's environment set-up, which then
      finds it initialised. With CUDA present nothing changes.
    - Checkpoint loading unpickles mmengine's checkpoints (see
      :func:`trusted_checkpoint_load`).

    - A quiet start: what mmengine logs while the runner is built (environment,
      config, hooks) goes to the log file only, and the console says where it is;
      ``log_level='DEBUG'`` prints it as mmengine does. See :class:`ConsoleFilter`;
      third-party notices that say nothing about the run: :data:`THIRD_PARTY_NOISE`.
    - Checkpoint files: temporary files of saves that were killed before they
      finished (:class:`~.fileio.AtomicLocalBackend`) are removed from the work
      directory at start and from the directory of a resumed checkpoint, with a
      warning that lists them; a checkpoint that cannot be loaded stops the run with
      an error that names it and the newest earlier checkpoint that looks whole.

    Config: ``runner_type = 'RLRunner'``. ``xtuner train --deepspeed`` replaces the
    runner with mmengine's FlexibleRunner (GPU only), which keeps mmengine's own
    behaviour.
    """

    def __init__(self, *args, **kwargs) -> None:
        self._console_filter: ConsoleFilter | None = None
        try:
            super().__init__(*args, **kwargs)
        finally:
            quiet = self._console_filter is not None and self._console_filter.quiet
            if self._console_filter is not None:
                self._console_filter.quiet = False
        log_file = next((h.baseFilename for h in self.logger.handlers
                         if isinstance(h, logging.FileHandler)), None)
        if quiet and log_file:
            self.logger.info(f"Environment, config and hooks: {log_file} (log_level='DEBUG' "
                             'prints them here)')
        self._remove_stale_temporaries(self.work_dir)

    def build_logger(self, log_level: int | str = 'INFO', log_file: str | None = None,
                     **kwargs):
        logger = super().build_logger(log_level=log_level, log_file=log_file, **kwargs)
        level = logging.getLevelName(log_level) if isinstance(log_level, str) else log_level
        self._console_filter = ConsoleFilter(quiet=level > logging.DEBUG)
        quiet_third_party()
        for handler in logger.handlers:
            if (isinstance(handler, logging.StreamHandler)
                    and not isinstance(handler, logging.FileHandler)):
                handler.addFilter(self._console_filter)
        return logger

    def _remove_stale_temporaries(self, directory: str | os.PathLike) -> None:
        """Removes what killed saves left in ``directory`` (main process; before training)."""
        if not is_main_process():
            return
        removed = remove_stale_temporaries(directory)
        if removed:
            listed = ', '.join(f'{path.name} ({size / 2**20:.1f} MiB)' for path, size in removed)
            self.logger.warning(f'Removed {len(removed)} unfinished checkpoint file(s) that '
                                f'interrupted saves left in {directory}: {listed}')

    def resume(self, filename: str, *args, **kwargs) -> None:
        problem = checkpoint_problem(filename)
        if problem is not None:
            raise CheckpointError(unreadable_checkpoint_message(filename, problem))
        if Path(filename).parent.resolve() != Path(self.work_dir).resolve():
            self._remove_stale_temporaries(Path(filename).parent)
        super().resume(filename, *args, **kwargs)

    def setup_env(self, env_cfg: dict) -> None:
        if self.distributed:
            init_cpu_process_group(self.launcher, env_cfg)
        super().setup_env(env_cfg)

    def load_checkpoint(self, filename: str, *args, **kwargs):
        problem = checkpoint_problem(filename) if os.path.exists(filename) else None
        if problem is not None:
            raise CheckpointError(unreadable_checkpoint_message(filename, problem))
        try:
            with trusted_checkpoint_load():
                return super().load_checkpoint(filename, *args, **kwargs)
        except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile) as exc:
            raise CheckpointError(unreadable_checkpoint_message(
                filename, f'its data is damaged ({type(exc).__name__}: {exc})')) from exc
        except RuntimeError as exc:
            if 'PytorchStreamReader' not in str(exc):  # not the file: e.g. a shape mismatch
                raise
            raise CheckpointError(unreadable_checkpoint_message(
                filename, f'its data is damaged ({exc})')) from exc
