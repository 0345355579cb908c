"""Runner-facing parts for ``xtuner train``: the RL loop (``loop.py``, with its settings), the
stages of a step (``step/``), the run state between steps (``state/``) and the mmengine glue:
runners, hooks, logging (``runtime/``)."""

from .loop import RLTrainLoop
from .runtime.curves_hook import TrainingCurvesHook
from .runtime.export_hook import HFExportHook
from .runtime.flexible_runner import RLFlexibleRunner
from .runtime.health_hook import RunHealthHook
from .runtime.logging import OptionalTensorboardVisBackend, RLLogProcessor
from .runtime.runner import RLRunner
from .state.fileio import AtomicLocalBackend
from .state.loop_state_hook import RLLoopStateHook

__all__ = ['RLTrainLoop', 'RLLoopStateHook', 'TrainingCurvesHook', 'HFExportHook',
           'RunHealthHook', 'RLRunner', 'RLFlexibleRunner', 'AtomicLocalBackend', 'RLLogProcessor',
           'OptionalTensorboardVisBackend']
