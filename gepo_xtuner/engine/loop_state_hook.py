"""Checkpoints the RL loop's random state and metric history."""

import random
from typing import Any

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

KEY = 'gepo_xtuner/rl_loop'


@HOOKS.register_module()
class RLLoopStateHook(Hook):
    """Saves and restores what the RL loop needs to continue bit for bit.

    The checkpoint key ``'gepo_xtuner/rl_loop'`` holds the torch (and CUDA),
    NumPy and Python RNG states at the end of the saved step (sampling, minibatch
    shuffles and Clip-Cov's token choice draw from them) and the per-step metric
    history the training-curve figure is drawn from, and the policy loss's own state
    where it has one (Clip-Cov's seeded generator). The data position needs no
    entry: on resume the loop skips the prompts of the completed steps, which
    mmengine's samplers replay deterministically. :class:`RLTrainLoop` registers
    this hook itself.
    """

    priority = 'VERY_LOW'

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        rng: dict[str, Any] = dict(torch=torch.get_rng_state(), numpy=np.random.get_state(),
                                   python=random.getstate())
        if torch.cuda.is_available():
            rng['cuda'] = torch.cuda.get_rng_state_all()
        state = dict(rng=rng, history=list(runner.train_loop.history))
        loss = runner.train_loop.policy.policy_loss
        if hasattr(loss, 'state_dict'):  # e.g. Clip-Cov's seeded token sampler
            state['policy_loss'] = loss.state_dict()
        checkpoint[KEY] = state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if not runner._resume:
            return
        state = checkpoint.get(KEY)
        if state is None:
            print_log(f'checkpoint has no {KEY!r} entry: the RL loop continues with fresh '
                      'random state, so the run will not repeat an uninterrupted one exactly',
                      logger='current', level=30)
            return
        runner.train_loop.history = list(state['history'])
        runner.train_loop._pending_rng = state['rng']
        loss = runner.train_loop.policy.policy_loss
        if 'policy_loss' in state and hasattr(loss, 'load_state_dict'):
            loss.load_state_dict(state['policy_loss'])

    @staticmethod
    def restore_rng(loop: Any) -> None:
        """Applies saved RNG states; the loop calls this after skipping used prompts."""
        rng = getattr(loop, '_pending_rng', None)
        if rng is None:
            return
        torch.set_rng_state(rng['torch'])
        np.random.set_state(rng['numpy'])
        random.setstate(rng['python'])
        if 'cuda' in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng['cuda'])
        loop._pending_rng = None
