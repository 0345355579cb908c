"""Reward functions (:data:`gepo_xtuner.registry.REWARDS`) and per-domain routing."""

from .base import ExactMatchReward, RewardRouter
from .chart import ChartQAReward
from .choice import MultipleChoiceReward
from .code import CodeReward
from .instruction import InstructionFollowingReward
from .math import MathReward
from .numeric import NumericReward

__all__ = ['ChartQAReward', 'CodeReward', 'ExactMatchReward', 'InstructionFollowingReward',
           'MathReward', 'MultipleChoiceReward', 'NumericReward', 'RewardRouter']
