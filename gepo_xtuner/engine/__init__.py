"""Runner-facing parts for ``xtuner train``: the RL loop, hooks, runner, atomic file backend."""

from .curves_hook import TrainingCurvesHook
from .export_hook import HFExportHook
from .fileio import AtomicLocalBackend
from .flexible_runner import RLFlexibleRunner
from .health_hook import RunHealthHook
from .logging import OptionalTensorboardVisBackend, RLLogProcessor
from .loop import RLTrainLoop
from .loop_state_hook import RLLoopStateHook
from .runner import RLRunner

__all__ = ['RLTrainLoop', 'RLLoopStateHook', 'TrainingCurvesHook', 'HFExportHook',
           'RunHealthHook', 'RLRunner', 'RLFlexibleRunner', 'AtomicLocalBackend', 'RLLogProcessor',
           'OptionalTensorboardVisBackend']
