"""Advantage processors, built from :data:`gepo_xtuner.registry.ADVANTAGES`.

Estimators (GRPO, Dr.GRPO, RLOO) turn rewards into advantages; shapers (GEPO, AEPO)
wrap any estimator: ``dict(type='GEPOAdvantage', base=dict(type='RLOOAdvantage'))``.
"""

from .aepo import AEPOAdvantage, EntropyGateState
from .base import (AdvantageEstimator, AdvantageOutput, AdvantageProcessor, AdvantageShaper,
                   EntropyBand, GroupView, Shaping)
from .batch import AdvantageInputs, RolloutBatch, encode_domains
from .gepo import EntropyThresholdState, GEPOAdvantage, global_group_entropy_stats
from .grpo import DrGRPOAdvantage, GRPOAdvantage, RLOOAdvantage

__all__ = [
    'AdvantageEstimator', 'AdvantageOutput', 'AdvantageProcessor', 'AdvantageShaper',
    'EntropyBand', 'GroupView', 'Shaping', 'AdvantageInputs', 'RolloutBatch', 'encode_domains',
    'GRPOAdvantage', 'DrGRPOAdvantage', 'RLOOAdvantage', 'GEPOAdvantage', 'EntropyThresholdState',
    'global_group_entropy_stats', 'AEPOAdvantage', 'EntropyGateState'
]
