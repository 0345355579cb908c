"""AEPO's batch-entropy gate as an advantage processor (QwenLong-L1.5, arXiv 2512.12967)."""

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..ops.distributed import all_reduce_sum
from ..registry import ADVANTAGES
from .base import AdvantageEstimator, AdvantageShaper, GroupView, Shaping, response_token_sums
from .batch import AdvantageInputs
from .gepo import _check_eps_with_base


GATES = ('band', 'hysteresis')


@dataclass
class EntropyGateState:
    """State of the AEPO gate, carried across steps and checkpointed.

    Attributes:
        entropy_low, entropy_high: the configured thresholds (``entropy_high``
            None: no upper bound).
        gate: ``'band'`` or ``'hysteresis'`` (see :class:`AEPOAdvantage`).
        positive_only: whether the gate was on at the last step (for
            ``'hysteresis'`` it also decides the next step).
        num_updates: steps seen.
    """

    entropy_low: float
    entropy_high: float | None
    gate: str = 'band'
    positive_only: bool = False
    num_updates: int = 0

    def update(self, batch_entropy: float) -> bool:
        """Moves the gate with this step's batch entropy; returns whether it is on."""
        high = math.inf if self.entropy_high is None else self.entropy_high
        if self.gate == 'band':
            self.positive_only = self.entropy_low < batch_entropy < high
        elif not self.positive_only and batch_entropy > high:
            self.positive_only = True
        elif self.positive_only and batch_entropy < self.entropy_low:
            self.positive_only = False
        self.num_updates += 1
        return self.positive_only

    def state_dict(self) -> dict[str, Any]:
        return dict(positive_only=self.positive_only, num_updates=self.num_updates,
                    config=self._config())

    def _config(self) -> dict[str, Any]:
        return dict(entropy_low=self.entropy_low, entropy_high=self.entropy_high, gate=self.gate)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = {'positive_only', 'num_updates', 'config'} - set(state)
        if missing:
            raise KeyError(f'AEPO gate state is missing {sorted(missing)}; got keys {sorted(state)}')
        saved = dict(state['config'])
        saved.setdefault('gate', 'hysteresis')  # checkpoints written before the band gate
        if saved != self._config():
            warnings.warn(f'AEPO gate was saved with {saved} but this run uses '
                          f'{self._config()}; continuing with the new settings', stacklevel=2)
        self.positive_only = bool(state['positive_only'])
        self.num_updates = int(state['num_updates'])


@ADVANTAGES.register_module()
class AEPOAdvantage(AdvantageShaper):
    """AEPO's batch-entropy gate around an estimator (QwenLong-L1.5, arXiv 2512.12967).

    The estimator is GRPO unless ``base`` names another, as in the authors' setup.

    Follows the authors' released code (README of Tongyi-Zhiwen/Qwen-Doc,
    QwenLong-L1.5, "AEPO"), which runs after the advantage computation:

    - **Gated quantity**: the batch's policy entropy, the full-vocabulary token
      entropy of the old policy averaged over all valid tokens of the step
      (token-mean, all data-parallel ranks together):
      ``H = sum_{i,t} m_it * H_it / sum_{i,t} m_it``. (Without ``entropies`` in
      the batch the sampled-token estimate ``-logprobs`` stands in.)
    - **Rule** (``gate='band'``, the code's): the gate is on when
      ``entropy_low < H < entropy_high``.
    - **When on**: only responses with ``A_i > 0`` AND ``r_i > 0`` stay; all others
      are REMOVED from the batch (``Shaping.removed``; ``AdvantageOutput.keep`` is
      False for them), so
      they also leave the loss's token-mean denominator. Their advantage is also
      set to 0, so a caller that ignores ``keep`` never trains on them.

    Where paper text and code differ: the code's comment reads "clip negative
    gradient when entropy > aepo_entropy_high" while its condition is the band
    above; with ``entropy_high=None`` (no upper bound, the default here) the two
    agree. The code also truncates the kept batch to a multiple of the world
    size (verl dispatches equal shares); here every rank keeps its own rows, so
    nothing is truncated. ``gate='hysteresis'`` is an alternative reading of the
    paper's description, not the code: on above ``entropy_high``, off again only
    below ``entropy_low``.

    No thresholds were published; the default ``entropy_low=0.6`` is this
    project's choice for full-vocabulary entropy at temperature 1 and must be
    tuned to the model (see the ``entropy/policy`` metric of a GRPO run). Not to
    be confused with the unrelated "AEPO" of arXiv 2510.08141.

    Args:
        entropy_low: lower threshold. Default 0.6.
        entropy_high: upper threshold, ``>= entropy_low``, or None for none
            (required for ``gate='hysteresis'``). Default None.
        gate: ``'band'`` (authors' code) or ``'hysteresis'``. Default ``'band'``.
        eps: the std guard of the default GRPO base. Default 1e-8.
        base: the estimator to gate, e.g. ``dict(type='RLOOAdvantage')``; None:
            ``GRPOAdvantage(eps=eps)``.
    """

    def __init__(self, entropy_low: float = 0.6, entropy_high: float | None = None,
                 gate: str = 'band', eps: float = 1e-8,
                 base: dict | AdvantageEstimator | None = None) -> None:
        _check_eps_with_base(type(self).__name__, eps, base)
        super().__init__(base, default_eps=eps)
        if gate not in GATES:
            raise ValueError(f'AEPOAdvantage gate must be one of {list(GATES)}, got {gate!r}')
        if gate == 'hysteresis' and entropy_high is None:
            raise ValueError("AEPOAdvantage(gate='hysteresis') needs entropy_high (the level "
                             'that turns the gate on)')
        high = math.inf if entropy_high is None else entropy_high
        if not (math.isfinite(entropy_low) and not math.isnan(high)
                and 0 <= entropy_low <= high):
            raise ValueError('AEPOAdvantage needs 0 <= entropy_low <= entropy_high, got '
                             f'entropy_low={entropy_low}, entropy_high={entropy_high}')
        self.entropy_low = float(entropy_low)
        self.entropy_high = None if entropy_high is None else float(entropy_high)
        self.gate = gate

    state_type = EntropyGateState
    measures = 'batch entropy'

    def shape(self, advantages: Tensor, groups: GroupView, batch: AdvantageInputs,
              state: EntropyGateState) -> Shaping:
        per_token = batch.entropies if batch.entropies is not None else -batch.logprobs
        sums, lengths = response_token_sums(per_token, batch.mask)
        total, count = all_reduce_sum(torch.stack([sums.sum(), lengths.sum()])).tolist()
        entropy = total / count if count > 0 else math.nan
        adv = advantages
        removed = torch.zeros_like(adv, dtype=torch.bool)
        if count > 0 and state.update(entropy):
            removed = ~((adv > 0) & (batch.rewards.to(adv.dtype) > 0))
            adv = torch.where(removed, 0.0, adv)
        none = torch.zeros_like(removed)
        metrics = {'aepo/batch_policy_entropy': entropy,
                   'aepo/positive_only': float(state.positive_only),
                   'aepo/frac_kept': float(1.0 - removed.double().mean())}
        return Shaping(adv, none, none, removed, metrics=metrics)

    def init_state(self) -> EntropyGateState:
        return EntropyGateState(self.entropy_low, self.entropy_high, self.gate)
