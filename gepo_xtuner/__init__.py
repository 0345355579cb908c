"""gepo-xtuner: GEPO (Group Entropy-Controlled Policy Optimization) for XTuner / LMDeploy.

Importing the package registers every processor and loss in
:mod:`gepo_xtuner.registry`, which is what ``custom_imports=dict(imports=['gepo_xtuner'])``
in an mmengine/XTuner config relies on.
"""

from . import advantage, loss  # noqa: F401  (registers modules)
from .registry import ADVANTAGES, POLICY_LOSSES

__version__ = '0.1.0'
__all__ = ['ADVANTAGES', 'POLICY_LOSSES', '__version__']
