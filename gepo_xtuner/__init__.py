"""gepo-xtuner: GEPO (Group Entropy-Controlled Policy Optimization) for XTuner / LMDeploy.

Importing the package registers every processor, loss, rollout backend and reward
in :mod:`gepo_xtuner.registry`, and the RL loop, hooks, policy model, dataset and
runner in mmengine's root registries, which is what
``custom_imports=dict(imports=['gepo_xtuner'])`` in an mmengine/XTuner config relies on.

Importing changes nothing outside the package: no matplotlib backend, no environment
variable, no patched module. The only exception is XTuner's own training process
(``xtuner train ... --resume``), where :mod:`gepo_xtuner.compat` lists what it does.
The CPU demo's tiny model and synthetic tasks are not imported.

Without mmengine (``pip install gepo-xtuner[trl]`` or ``[verl]``, beside another trainer),
the import brings the core only: the advantage processors and policy losses, in
registries of their own (:mod:`gepo_xtuner.standalone_registry`); the XTuner-facing parts
(loop, hooks, rollout backends, rewards, data) need ``pip install gepo-xtuner[xtuner]``.
"""

from . import advantage, loss  # noqa: F401  (registers)
from .registry import ADVANTAGES, HAVE_MMENGINE, POLICY_LOSSES, REWARDS, ROLLOUT_BACKENDS

__version__ = '0.1.0'

if HAVE_MMENGINE:
    from . import data, engine, model, reward, rollout  # noqa: F401  (registers)
    from .compat import apply_xtuner_train_shims

    apply_xtuner_train_shims()
__all__ = ['ADVANTAGES', 'POLICY_LOSSES', 'REWARDS', 'ROLLOUT_BACKENDS', '__version__']
