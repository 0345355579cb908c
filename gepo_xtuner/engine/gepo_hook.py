"""A config entry of earlier versions, kept so that their configs still build."""

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS


@HOOKS.register_module()
class GEPOThresholdHook(Hook):
    """Does nothing: the RL loop owns and checkpoints the advantage processor's state.

    Configs of earlier versions listed ``dict(type='GEPOThresholdHook')`` in
    ``custom_hooks``; such configs still build and train exactly as before, and the
    log says that the entry can go. Checkpoints they wrote resume as they are.
    """

    def before_run(self, runner) -> None:
        print_log("custom_hooks: dict(type='GEPOThresholdHook') is no longer needed (the RL "
                  'loop checkpoints its processor state itself); remove it from the config',
                  logger='current', level=30)
