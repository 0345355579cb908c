"""The parts of mmengine's ``Runner`` and ``CheckpointHook`` that are not public API and
that this package relies on, in one place.

mmengine offers no public way to ask whether a run was started with ``--resume`` (hooks'
``after_load_checkpoint`` runs for ``load_from`` too), to save a checkpoint off the
``CheckpointHook``'s schedule under its file names, backend and ``max_keep_ckpts``
bookkeeping, or to ask whether the hook will save at the end of the current iteration.
Every such use goes through a function here: ``resuming`` and ``resumed_entry``, which the
state hooks need, are defined in :mod:`gepo_xtuner.engine.state.resume` (``engine/state``
never imports ``engine/runtime``) and re-exported here.
``tests/test_engine/test_mmengine_private.py`` runs them against the installed mmengine (a
real ``Runner``), so a release that renames or changes one fails there, naming it, and not
in the middle of a training run.
"""

from typing import Any

from mmengine.hooks import CheckpointHook

from ..state.resume import resumed_entry, resuming

__all__ = ['checkpoint_due', 'checkpoint_hook', 'resumed_entry', 'resuming',
           'save_checkpoint_now']


def checkpoint_hook(runner: Any) -> CheckpointHook | None:
    """The runner's ``CheckpointHook``, or None."""
    return next((h for h in runner.hooks if isinstance(h, CheckpointHook)), None)


def checkpoint_due(runner: Any, max_steps: int) -> bool:
    """Whether the runner's ``CheckpointHook`` saves at the end of the current step
    (``runner.iter``, 0-based, not yet advanced), by the hook's own rule: every
    ``interval`` iterations from ``save_begin``, and the last with ``save_last``; by
    epoch, when the run's one epoch ends with its last step. Reads the hook's
    ``by_epoch``, ``interval``, ``save_begin``, ``save_last`` and its
    ``every_n_train_iters``."""
    hook = checkpoint_hook(runner)
    if hook is None:
        return False
    last = runner.iter + 1 == max_steps
    if hook.by_epoch:
        return last
    return bool(hook.every_n_train_iters(runner, hook.interval, hook.save_begin)
                or (hook.save_last and last))


def save_checkpoint_now(runner: Any) -> str:
    """Saves a checkpoint of the current iteration now, off the schedule, and returns
    its path.

    Through the ``CheckpointHook`` when there is one (``_save_checkpoint``: its
    directory, file names, storage backend and ``max_keep_ckpts`` bookkeeping, as a
    scheduled save), else ``Runner.save_checkpoint`` into the work directory.
    Called on every rank (the runner writes on rank 0).
    """
    saver = checkpoint_hook(runner)
    name = f'iter_{runner.iter + 1}.pth'
    if saver is None:
        runner.save_checkpoint(runner.work_dir, name, by_epoch=False)
        return f'{runner.work_dir}/{name}'
    saver._save_checkpoint(runner)
    return f'{saver.out_dir}/{saver.filename_tmpl.format(runner.iter + 1)}'
