"""Whether a run resumes, and a hook's entry of the checkpoint it resumes from.

These read one non-public attribute of mmengine's ``Runner`` (``_resume``). They live
here, beside the hooks that move run state into checkpoints, because ``engine/state`` is
the lower layer: ``engine/runtime`` imports it, never the reverse
(``tests/test_layout.py``). :mod:`gepo_xtuner.engine.runtime.mmengine_private`, the list
of every non-public part of mmengine the package uses, re-exports them, so its test runs
them against the installed mmengine with the others.
"""

import logging
from typing import Any

from mmengine.logging import print_log

__all__ = ['resumed_entry', 'resuming']


def resuming(runner: Any) -> bool:
    """Whether the runner resumes a run (``--resume`` / ``resume=True``), as opposed to
    only loading weights (``load_from``). Reads ``Runner._resume``."""
    return bool(runner._resume)


def resumed_entry(runner: Any, checkpoint: dict, key: str, if_missing: str) -> Any | None:
    """A hook's entry ``key`` of a loaded ``checkpoint`` when the run resumes from it,
    for the hook's ``after_load_checkpoint``.

    Returns:
        The entry; None when the run only loads weights (``load_from``), or when the
        checkpoint has no such entry (then ``if_missing``, what starts afresh, is logged
        as a warning).
    """
    if not resuming(runner):
        return None
    entry = checkpoint.get(key)
    if entry is None:
        print_log(f'checkpoint has no {key!r} entry: {if_missing}', logger='current',
                  level=logging.WARNING)
    return entry
