"""Compatibility shims for XTuner 0.2.0's training program, and nothing else.

Every workaround of this package for the installed stack is listed here, with the
process it acts in. In an ordinary process (``python -c 'import gepo_xtuner'``, a
test, a notebook) none of them changes anything outside the package.

=========================================  ==============================================
shim                                       acts only in
=========================================  ==============================================
:func:`refuse_unreadable_resume_checkpoint`  ``xtuner/tools/train.py ... --resume CKPT``:
                                           exits with a clear message on a cut-off CKPT
:func:`allow_pickle_checkpoints_for_xtuner_resume`  the same process: sets
                                           ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` there,
                                           because XTuner reads CKPT with a bare
                                           ``torch.load`` before any runner exists
``_gepo_xtuner_transformers5`` (top level)  the first ``import xtuner.utils`` of a
                                           process: adds the one name transformers 5
                                           removed and XTuner 0.2.0 imports; a start-up
                                           hook, because XTuner imports it before any
                                           config can import this package
                                           (docs/transformers5.md)
``_gepo_xtuner_quiet`` (top level)         the first lookup of ``bitsandbytes`` in a
                                           process: filters its "compiled without GPU
                                           support" notice out of its logger while torch
                                           sees no CUDA device; a start-up hook for the
                                           same reason (``mmengine.optim`` imports it)
=========================================  ==============================================

:func:`apply_xtuner_train_shims` is what ``import gepo_xtuner`` calls; it returns at
once unless ``sys.argv`` is XTuner's training program's.
"""

import os
import sys
import warnings
from pathlib import PurePath

from mmengine.logging import print_log

WEIGHTS_ONLY_ENV = 'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD'


def _xtuner_resume_path(argv: list[str]) -> str | None:
    """The ``--resume`` argument when ``argv`` is xtuner's training program's, else None."""
    if not argv or PurePath(argv[0]).parts[-3:] != ('xtuner', 'tools', 'train.py'):
        return None
    for i, arg in enumerate(argv[1:], start=1):
        if arg == '--resume':
            return argv[i + 1] if i + 1 < len(argv) else None
        if arg.startswith('--resume='):
            return arg.split('=', 1)[1]
    return None


def apply_xtuner_train_shims(argv: list[str] | None = None) -> None:
    """Runs the shims of XTuner's training process; does nothing in any other process.

    Raises:
        SystemExit: ``--resume`` names a cut-off checkpoint (see
            :func:`refuse_unreadable_resume_checkpoint`).
    """
    argv = sys.argv if argv is None else argv
    if _xtuner_resume_path(argv) is None:
        return
    allow_pickle_checkpoints_for_xtuner_resume(argv)
    refuse_unreadable_resume_checkpoint(argv)


def refuse_unreadable_resume_checkpoint(argv: list[str] | None = None) -> None:
    """Stops ``xtuner train CFG --resume CKPT`` at once if CKPT is cut off or not a checkpoint.

    xtuner 0.2.0 loads the checkpoint for its seed before any runner exists, and a
    truncated file then fails with torch's ``PytorchStreamReader failed reading zip
    archive``. This runs when ``custom_imports`` imports the package, before that load,
    and exits with the file, the reason and the newest earlier checkpoint of the same
    directory that looks whole (:func:`~gepo_xtuner.engine.state.fileio.checkpoint_problem`).
    Directories (DeepSpeed checkpoints) and missing files are left to xtuner.

    Raises:
        SystemExit: with that message, when the file is unreadable.
    """
    from .engine.state.fileio import checkpoint_problem, unreadable_checkpoint_message

    path = _xtuner_resume_path(sys.argv if argv is None else argv)
    if path is None or not os.path.isfile(path):
        return
    problem = checkpoint_problem(path)
    if problem is not None:
        raise SystemExit(f'error: {unreadable_checkpoint_message(path, problem)}')


def allow_pickle_checkpoints_for_xtuner_resume(argv: list[str] | None = None) -> bool:
    """Lets ``xtuner train CFG --resume CKPT`` load mmengine checkpoints on torch >= 2.6.

    xtuner 0.2.0 reads the seed from the checkpoint with a bare ``torch.load``
    before any runner exists; torch >= 2.6 defaults to ``weights_only=True`` and
    rejects mmengine checkpoints (they pickle message-hub buffers and NumPy
    state). This package is imported through ``custom_imports`` before that
    call, so when -- and only when -- this process is xtuner's training entry
    point with ``--resume``, it sets ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` for
    the process. A pickle load runs code from the file: resume only from
    checkpoints you trust.

    Returns:
        Whether the variable was set.
    """
    argv = sys.argv if argv is None else argv
    if not argv or PurePath(argv[0]).parts[-3:] != ('xtuner', 'tools', 'train.py'):
        return False
    if not any(a == '--resume' or a.startswith('--resume=') for a in argv[1:]):
        return False
    # torch warns at each such load (twice per resume); the notice below says it once
    warnings.filterwarnings('ignore', message=f'Environment variable {WEIGHTS_ONLY_ENV} detected')
    if os.environ.get(WEIGHTS_ONLY_ENV) != '1':
        os.environ[WEIGHTS_ONLY_ENV] = '1'
        print_log('xtuner train --resume: allowing pickle checkpoint loads '
                  f'({WEIGHTS_ONLY_ENV}=1); resume only from checkpoints you trust',
                  logger='current')
    return True
