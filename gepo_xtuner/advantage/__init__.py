"""Advantage processors, built from :data:`gepo_xtuner.registry.ADVANTAGES`."""

from .aepo import AEPOAdvantage, EntropyGateState
from .base import AdvantageOutput, AdvantageProcessor
from .batch import RolloutBatch, encode_domains
from .gepo import EntropyThresholdState, GEPOAdvantage, global_group_entropy_stats
from .grpo import DrGRPOAdvantage, GRPOAdvantage, RLOOAdvantage

__all__ = [
    'AdvantageOutput', 'AdvantageProcessor', 'RolloutBatch', 'encode_domains', 'GRPOAdvantage',
    'DrGRPOAdvantage', 'RLOOAdvantage', 'GEPOAdvantage', 'EntropyThresholdState',
    'global_group_entropy_stats', 'AEPOAdvantage', 'EntropyGateState'
]
