"""Owns the advantage processor's state (GEPO's thresholds) and checkpoints it."""

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

KEY = 'gepo_xtuner/advantage_state'


@HOOKS.register_module()
class GEPOThresholdHook(Hook):
    """Keeps GEPO's entropy thresholds (or any stateful processor's state) across steps.

    Creates the state from the loop's processor before the run, hands it to the
    loop, writes ``state_dict()`` under the checkpoint key
    ``'gepo_xtuner/advantage_state'`` and restores it on ``--resume`` (a checkpoint
    without the key is resumed with fresh thresholds and a warning). The state is
    computed from all-reduced statistics, so it is identical on every rank.
    Stateless processors (GRPO, ...) make this hook a no-op.

    Config::

        custom_hooks = [dict(type='GEPOThresholdHook')]
    """

    priority = 'NORMAL'

    def __init__(self) -> None:
        self.state = None

    def before_run(self, runner) -> None:
        loop = runner.train_loop
        self.state = loop.advantage.init_state()
        loop.advantage_state = self.state

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if self.state is not None:
            checkpoint[KEY] = dict(processor=type(runner.train_loop.advantage).__name__,
                                   state=self.state.state_dict())

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if not runner._resume or self.state is None:
            return
        saved = checkpoint.get(KEY)
        if saved is None:
            print_log(f'checkpoint has no {KEY!r} entry (saved without GEPOThresholdHook?); '
                      'the advantage thresholds start fresh', logger='current', level=30)
            return
        current = type(runner.train_loop.advantage).__name__
        if saved['processor'] != current:
            print_log(f'checkpoint holds {saved["processor"]} state but this run uses {current}; '
                      'the advantage state starts fresh', logger='current', level=30)
            return
        self.state.load_state_dict(saved['state'])
        runner.logger.info(f'restored {saved["processor"]} state: {saved["state"]}')
