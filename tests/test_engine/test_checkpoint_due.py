"""The steps at which the RL loop gathers every rank's batch generated ahead: those at
which mmengine's own ``CheckpointHook`` saves."""

from types import SimpleNamespace

import pytest
from mmengine.hooks import CheckpointHook

from gepo_xtuner.engine.run_state import checkpoint_due


def saved_steps(hook_cfg: dict | None, steps: int = 10) -> list[int]:
    """1-based steps at which the loop expects a checkpoint.

    The runner here holds only what the rule reads (``hooks``, ``iter``); the hook is
    mmengine's."""
    hooks = [CheckpointHook(**hook_cfg)] if hook_cfg is not None else []
    return [i + 1 for i in range(steps)
            if checkpoint_due(SimpleNamespace(hooks=hooks, iter=i), steps)]


@pytest.mark.parametrize('cfg,expected', [
    (dict(interval=1, by_epoch=False), list(range(1, 11))),
    (dict(interval=3, by_epoch=False), [3, 6, 9, 10]),
    (dict(interval=3, by_epoch=False, save_last=False), [3, 6, 9]),
    (dict(interval=4, by_epoch=False, save_begin=2), [2, 6, 10]),  # mmengine's rule
    (dict(interval=1, by_epoch=True), [10]),
    (None, []),
])
def test_the_loop_expects_checkpoints_where_the_hook_saves(cfg, expected):
    assert saved_steps(cfg) == expected
