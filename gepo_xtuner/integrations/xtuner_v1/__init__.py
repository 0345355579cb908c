"""GEPO for XTuner v1's RL trainer (``xtuner/v1``, Ray + LMDeploy); see docs/xtuner_v1.md.

Needs XTuner v1 installed (a source install; PyPI's ``xtuner`` is the legacy one).
Not imported by ``import gepo_xtuner``. In a v1 config::

    from gepo_xtuner.integrations.xtuner_v1 import GEPOAdvantageConfig, GEPORLColocateTrainerConfig

    trainer = GEPORLColocateTrainerConfig(..., advantage_estimator_config=GEPOAdvantageConfig())
"""

from .estimator import GEPOAdvantageConfig, GEPOEstimator, StepAdvantageEstimator
from .trainer import (GEPORLColocateTrainer, GEPORLColocateTrainerConfig,
                      GEPORLDisaggregatedTrainer, GEPORLDisaggregatedTrainerConfig,
                      StepAdvantageTrainerMixin, load_estimator_state, save_estimator_state)

__all__ = [
    'GEPOAdvantageConfig', 'GEPOEstimator', 'StepAdvantageEstimator', 'StepAdvantageTrainerMixin',
    'GEPORLColocateTrainer', 'GEPORLDisaggregatedTrainer', 'GEPORLColocateTrainerConfig',
    'GEPORLDisaggregatedTrainerConfig', 'save_estimator_state', 'load_estimator_state'
]
