"""Reward functions (:data:`gepo_xtuner.registry.REWARDS`) and per-domain routing."""

from .base import ExactMatchReward, RewardRouter

__all__ = ['ExactMatchReward', 'RewardRouter']
