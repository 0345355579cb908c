"""Rollout backends, built from :data:`gepo_xtuner.registry.ROLLOUT_BACKENDS`."""

from .base import RolloutBackend, RolloutRequest, RolloutSample, SamplingParams
from .hf import HFRolloutBackend

__all__ = ['RolloutBackend', 'RolloutRequest', 'RolloutSample', 'SamplingParams',
           'HFRolloutBackend']
