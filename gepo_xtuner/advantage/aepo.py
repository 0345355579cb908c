"""AEPO's batch-entropy gate as an advantage processor (QwenLong-L1.5, arXiv 2512.12967)."""

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..ops.distributed import all_reduce_sum
from ..registry import ADVANTAGES
from .base import GroupView
from .batch import RolloutBatch
from .grpo import GRPOAdvantage


@dataclass
class EntropyGateState:
    """Hysteresis state of the AEPO gate, carried across steps and checkpointed.

    Attributes:
        entropy_low, entropy_high: the configured hysteresis band.
        positive_only: True while negative-advantage samples are masked out.
        num_updates: steps seen.
    """

    entropy_low: float
    entropy_high: float
    positive_only: bool = False
    num_updates: int = 0

    def update(self, batch_entropy: float) -> bool:
        """Moves the gate with this step's batch entropy; returns whether to mask negatives."""
        if not self.positive_only and batch_entropy > self.entropy_high:
            self.positive_only = True
        elif self.positive_only and batch_entropy < self.entropy_low:
            self.positive_only = False
        self.num_updates += 1
        return self.positive_only

    def state_dict(self) -> dict[str, Any]:
        return dict(positive_only=self.positive_only, num_updates=self.num_updates,
                    config=dict(entropy_low=self.entropy_low, entropy_high=self.entropy_high))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = {'positive_only', 'num_updates', 'config'} - set(state)
        if missing:
            raise KeyError(f'AEPO gate state is missing {sorted(missing)}; got keys {sorted(state)}')
        current = dict(entropy_low=self.entropy_low, entropy_high=self.entropy_high)
        if state['config'] != current:
            warnings.warn(f'AEPO gate was saved with {state["config"]} but this run uses '
                          f'{current}; continuing with the new band', stacklevel=2)
        self.positive_only = bool(state['positive_only'])
        self.num_updates = int(state['num_updates'])


@ADVANTAGES.register_module()
class AEPOAdvantage(GRPOAdvantage):
    """GRPO advantages behind AEPO's batch-level entropy gate with hysteresis.

    Batch entropy is the mean over responses of each response's mean token entropy
    (full-vocabulary entropies when the batch carries ``entropies``, otherwise the
    sampled-token estimate ``-logprobs``), reduced over all data-parallel ranks.
    When it rises above ``entropy_high``, negative advantages are set to 0
    (positive-only updates, which lower entropy) until it falls below
    ``entropy_low``; then negatives return. The gate decision made with this step's
    entropy applies to this step's batch.

    QwenLong-L1.5 published no threshold values. The defaults below are this
    project's choice for sampled-token entropy at temperature 1 and must be tuned
    to the model's entropy scale (see the ``entropy/group_mean`` metric of a GRPO
    run). Not to be confused with the unrelated "AEPO" of arXiv 2510.08141.

    Args:
        entropy_low: gate opens again (negatives return) below this. Default 0.4.
        entropy_high: gate closes (positive-only) above this. Default 0.6. Must be
            >= ``entropy_low``.
        eps: GRPO's std guard. Default 1e-8.
    """

    def __init__(self, entropy_low: float = 0.4, entropy_high: float = 0.6,
                 eps: float = 1e-8) -> None:
        super().__init__(eps=eps)
        if not (math.isfinite(entropy_low) and math.isfinite(entropy_high)
                and 0 <= entropy_low <= entropy_high):
            raise ValueError('AEPOAdvantage needs 0 <= entropy_low <= entropy_high, got '
                             f'entropy_low={entropy_low}, entropy_high={entropy_high}')
        self.entropy_low = float(entropy_low)
        self.entropy_high = float(entropy_high)

    def init_state(self) -> EntropyGateState:
        return EntropyGateState(self.entropy_low, self.entropy_high)

    def _shape(self, adv: Tensor, groups: GroupView, batch: RolloutBatch,
               state: EntropyGateState | None) -> tuple[Tensor, Tensor, Tensor, dict[str, float]]:
        if not isinstance(state, EntropyGateState):
            raise TypeError('AEPOAdvantage is stateful: create the state once with '
                            '`state = processor.init_state()` and pass it to every call, '
                            f'got {type(state).__name__}')
        if batch.logprobs is None:
            raise ValueError('AEPOAdvantage needs logprobs and mask in the batch to measure '
                             'batch entropy')
        ok = groups.lengths > 0
        sums = torch.stack([ok.to(torch.float64).sum(),
                            torch.where(ok, groups.seq_entropy, 0.0).sum()])
        count, total = all_reduce_sum(sums).tolist()
        high = torch.zeros_like(adv, dtype=torch.bool)
        entropy = total / count if count > 0 else math.nan
        if count > 0 and state.update(entropy):
            high = adv < 0
            adv = torch.where(high, 0.0, adv)
        low = torch.zeros_like(high)
        metrics = {'aepo/batch_entropy': entropy, 'aepo/positive_only': float(state.positive_only)}
        return adv, low, high, metrics
