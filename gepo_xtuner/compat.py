"""Compatibility with the stack as installed: xtuner 0.2.0 CLI on torch >= 2.6."""

import os
import sys
from pathlib import PurePath

from mmengine.logging import print_log

WEIGHTS_ONLY_ENV = 'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD'


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
    if os.environ.get(WEIGHTS_ONLY_ENV) != '1':
        os.environ[WEIGHTS_ONLY_ENV] = '1'
        print_log('xtuner train --resume: allowing pickle checkpoint loads '
                  f'({WEIGHTS_ONLY_ENV}=1); resume only from checkpoints you trust',
                  logger='current')
    return True
