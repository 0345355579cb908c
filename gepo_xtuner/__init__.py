"""gepo-xtuner: GEPO (Group Entropy-Controlled Policy Optimization) for XTuner / LMDeploy.

Importing the package registers every processor, loss, rollout backend and reward
in :mod:`gepo_xtuner.registry`, and the RL loop, hooks, policy model, dataset and
runner in mmengine's root registries, which is what
``custom_imports=dict(imports=['gepo_xtuner'])`` in an mmengine/XTuner config relies on.
"""

from . import advantage, data, engine, loss, model, reward, rollout  # noqa: F401  (registers)
from .compat import allow_pickle_checkpoints_for_xtuner_resume, refuse_unreadable_resume_checkpoint
from .registry import ADVANTAGES, POLICY_LOSSES, REWARDS, ROLLOUT_BACKENDS

__version__ = '0.1.0'

allow_pickle_checkpoints_for_xtuner_resume()
refuse_unreadable_resume_checkpoint()
__all__ = ['ADVANTAGES', 'POLICY_LOSSES', 'REWARDS', 'ROLLOUT_BACKENDS', '__version__']
