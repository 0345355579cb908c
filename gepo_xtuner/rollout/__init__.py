"""Rollout backends, built from :data:`gepo_xtuner.registry.ROLLOUT_BACKENDS`."""

from .base import RolloutBackend, RolloutRequest, RolloutSample, SamplingParams
from .hf import HFRolloutBackend
from .lmdeploy import LMDeployRolloutBackend, LMDeployServerError
from .vllm import VLLMRolloutBackend, VLLMServerError

__all__ = ['HFRolloutBackend', 'LMDeployRolloutBackend', 'LMDeployServerError', 'RolloutBackend',
           'RolloutRequest', 'RolloutSample', 'SamplingParams', 'VLLMRolloutBackend',
           'VLLMServerError']
