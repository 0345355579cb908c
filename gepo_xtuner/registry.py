"""Registries: one mmengine child registry per extension point.

Every registry is a child of an mmengine root registry and carries ``locations``,
so a pure-dict config resolves ``type='GEPOAdvantage'`` once ``gepo_xtuner`` is
imported (``custom_imports=dict(imports=['gepo_xtuner'])``) and, if the user forgot
that import, the lookup itself imports the module that registers the name.
Registered names equal class names; registering a second class under a taken
name raises ``KeyError`` (mmengine's ``force=False``) instead of replacing it.

Example:
    >>> from gepo_xtuner.registry import ADVANTAGES
    >>> proc = ADVANTAGES.build(dict(type='GEPOAdvantage', alpha_low=1.0))
    >>> type(proc).__name__
    'GEPOAdvantage'

Because mmengine allows one child per scope under a parent, each extension point
hangs under a different root registry, chosen by what the objects are:

=================  =======================  ==========================================
registry           parent (mmengine root)   what it holds
=================  =======================  ==========================================
``ADVANTAGES``     ``TASK_UTILS``           advantage processors (GRPO, GEPO, ...)
``POLICY_LOSSES``  ``MODELS``               policy-gradient losses (PPO clip, CISPO, ...)
``ROLLOUT_BACKENDS`` ``INFERENCERS``        rollout (generation) backends
``REWARDS``        ``FUNCTIONS``            reward functions, routed per domain
=================  =======================  ==========================================

The runner-facing parts (the RL train loop, hooks, the policy model, the runner)
register into mmengine's root ``LOOPS``, ``HOOKS``, ``MODELS`` and ``RUNNERS``, where
``xtuner train`` looks them up.

From a root registry, the scoped name ``'gepo_xtuner.GEPOAdvantage'`` also resolves.

Without mmengine (a TRL, verl or slime environment, ``pip install gepo-xtuner[trl]``), each
registry is a :class:`~gepo_xtuner.standalone_registry.Registry` with the same names,
registration and build rules, and no parent.
"""

try:
    from mmengine.registry import FUNCTIONS as MMENGINE_FUNCTIONS
    from mmengine.registry import INFERENCERS as MMENGINE_INFERENCERS
    from mmengine.registry import MODELS as MMENGINE_MODELS
    from mmengine.registry import TASK_UTILS as MMENGINE_TASK_UTILS
    from mmengine.registry import Registry, build_from_cfg
    HAVE_MMENGINE = True
except ModuleNotFoundError as missing:
    if missing.name != 'mmengine':
        raise
    # A TRL, verl or slime environment: the registries keep mmengine's contract without it
    from .standalone_registry import Registry  # type: ignore[assignment]
    HAVE_MMENGINE = False


def _build_in_own_scope(cfg, *args, registry: Registry, **kwargs):
    """Builds from ``registry`` itself whatever mmengine default scope is active.

    Inside a Runner the default scope is ``'mmengine'``, and mmengine's builder would
    switch to the root registry, where our names are absent. Pinning ``_scope_`` to
    the registry's own scope keeps lookups here (and in its parents).
    """
    if isinstance(cfg, dict) and '_scope_' not in cfg:
        cfg = type(cfg)(cfg) if not hasattr(cfg, 'copy') else cfg.copy()
        cfg['_scope_'] = registry.scope
    return build_from_cfg(cfg, registry, *args, **kwargs)


__all__ = ['ADVANTAGES', 'POLICY_LOSSES', 'ROLLOUT_BACKENDS', 'REWARDS', 'shipped']


def _child(name: str, parent: str, location: str) -> Registry:
    """A child of the mmengine root registry named ``parent``, in the ``gepo_xtuner``
    scope; without mmengine, a :class:`~gepo_xtuner.standalone_registry.Registry`."""
    if not HAVE_MMENGINE:
        return Registry(name, scope='gepo_xtuner', locations=[location])
    roots = dict(TASK_UTILS=MMENGINE_TASK_UTILS, MODELS=MMENGINE_MODELS,
                 INFERENCERS=MMENGINE_INFERENCERS, FUNCTIONS=MMENGINE_FUNCTIONS)
    return Registry(name, build_func=_build_in_own_scope, parent=roots[parent],
                    scope='gepo_xtuner', locations=[location])


ADVANTAGES = _child('advantage processor', 'TASK_UTILS', 'gepo_xtuner.advantage')
POLICY_LOSSES = _child('policy loss', 'MODELS', 'gepo_xtuner.loss')
ROLLOUT_BACKENDS = _child('rollout backend', 'INFERENCERS', 'gepo_xtuner.rollout')
REWARDS = _child('reward function', 'FUNCTIONS', 'gepo_xtuner.reward')


def shipped(registry: Registry) -> dict[str, type]:
    """The entries of ``registry`` that this package defines, by registered name.

    A user's plugin module (or a test's) registers into the same registries once it is
    imported anywhere in the process; this is the package's own part, whatever else was
    imported before. Devices of :mod:`gepo_xtuner.testbed` (e.g. the long-tail benchmark's
    backend) are not part of it.

    Example:
        >>> 'GEPOAdvantage' in shipped(ADVANTAGES)
        True
    """
    registry.import_from_location()  # every module that registers into it, imported
    return {name: cls for name, cls in registry.module_dict.items()
            if cls.__module__.split('.')[0] == 'gepo_xtuner'
            and not cls.__module__.startswith('gepo_xtuner.testbed.')}
