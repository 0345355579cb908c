"""Checkpoints the RL loop's run state under one key; the loop registers this hook itself."""

import random
from typing import Any

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

#: The checkpoint key of :meth:`RLTrainLoop.state_dict`.
KEY = 'gepo_xtuner/rl_loop'


def capture_rng() -> dict[str, Any]:
    """The torch (and CUDA), NumPy and Python RNG states of this process."""
    rng: dict[str, Any] = dict(torch=torch.get_rng_state(), numpy=np.random.get_state(),
                               python=random.getstate())
    if torch.cuda.is_available():
        rng['cuda'] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    """Sets the RNG states :func:`capture_rng` returned."""
    torch.set_rng_state(rng['torch'])
    np.random.set_state(rng['numpy'])
    random.setstate(rng['python'])
    if 'cuda' in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng['cuda'])


@HOOKS.register_module()
class RLLoopStateHook(Hook):
    """Writes ``runner.train_loop.state_dict()`` into each checkpoint and gives it back.

    The checkpoint key ``'gepo_xtuner/rl_loop'`` holds everything of the RL loop that
    changes during training (see :meth:`~gepo_xtuner.engine.loop.RLTrainLoop.state_dict`);
    on ``--resume`` the hook hands that entry to the loop's ``load_state_dict``.
    The hook only moves the entry: what it means is the loop's business.
    :class:`~gepo_xtuner.engine.loop.RLTrainLoop` registers it itself; configs do
    not list it.
    """

    priority = 'VERY_LOW'

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint[KEY] = runner.train_loop.state_dict()

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if not runner._resume:
            return
        state = checkpoint.get(KEY)
        if state is None:
            print_log(f'checkpoint has no {KEY!r} entry: the RL loop continues with fresh '
                      'random state and processor state, so the run will not repeat an '
                      'uninterrupted one exactly', logger='current', level=30)
            return
        runner.train_loop.load_state_dict(state)
