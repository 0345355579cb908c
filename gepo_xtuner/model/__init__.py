"""Policies: the mmengine RL policy.

The tiny character-level CPU model of the demo and its warm start
(:mod:`gepo_xtuner.testbed.tiny`, :mod:`gepo_xtuner.testbed.tiny_vl`) are fixtures, not
part of the library; ``import gepo_xtuner`` does not import them.
"""

from .inputs import LossInputs
from .policy import RLPolicy

__all__ = ['LossInputs', 'RLPolicy']
