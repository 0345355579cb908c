"""Registries: one mmengine child registry per extension point.

Every registry is a child of an mmengine root registry and carries ``locations``,
so a pure-dict config resolves ``type='GEPOAdvantage'`` once ``gepo_xtuner`` is
imported (``custom_imports=dict(imports=['gepo_xtuner'])``) and, if the user forgot
that import, the lookup itself imports the module that registers the name.
Registered names equal class names; registering a second class under a taken
name raises ``KeyError`` (mmengine's ``force=False``) instead of replacing it.

Example:
    >>> from gepo_xtuner.registry import ADVANTAGES
    >>> proc = ADVANTAGES.build(dict(type='GEPOAdvantage', alpha_low=0.5))
    >>> type(proc).__name__
    'GEPOAdvantage'

Because mmengine allows one child per scope under a parent, each extension point
hangs under a different root registry, chosen by what the objects are:

=================  =======================  ==========================================
registry           parent (mmengine root)   what it holds
=================  =======================  ==========================================
``ADVANTAGES``     ``TASK_UTILS``           advantage processors (GRPO, GEPO, ...)
``POLICY_LOSSES``  ``MODELS``               policy-gradient losses (PPO clip, CISPO, ...)
=================  =======================  ==========================================

From a root registry, the scoped name ``'gepo_xtuner.GEPOAdvantage'`` also resolves.
"""

from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import TASK_UTILS as MMENGINE_TASK_UTILS
from mmengine.registry import Registry

__all__ = ['ADVANTAGES', 'POLICY_LOSSES']

ADVANTAGES = Registry(
    'advantage processor',
    parent=MMENGINE_TASK_UTILS,
    scope='gepo_xtuner',
    locations=['gepo_xtuner.advantage'])

POLICY_LOSSES = Registry(
    'policy loss',
    parent=MMENGINE_MODELS,
    scope='gepo_xtuner',
    locations=['gepo_xtuner.loss'])
