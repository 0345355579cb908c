"""Checkpoints the RL loop's run state under one key; the loop registers this hook itself."""

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from .resume import resumed_entry

#: The checkpoint key of :meth:`RLTrainLoop.state_dict`.
KEY = 'gepo_xtuner/rl_loop'


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
        state = resumed_entry(runner, checkpoint, KEY, 'the RL loop continues with fresh '
                              'random state and processor state, so the run will not repeat '
                              'an uninterrupted one exactly')
        if state is not None:
            runner.train_loop.load_state_dict(state)
