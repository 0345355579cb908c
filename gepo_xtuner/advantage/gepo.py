"""GEPO: group entropy-controlled advantage shaping with adaptive EMA thresholds."""

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..ops.distributed import all_reduce_sum
from ..registry import ADVANTAGES
from .base import AdvantageEstimator, AdvantageShaper, EntropyBand, GroupView, Shaping
from .batch import AdvantageInputs


def _check(name: str, value: float, lo: float, hi: float, lo_open: bool = False) -> float:
    ok = (value > lo if lo_open else value >= lo) and value <= hi
    if not ok or not math.isfinite(value):
        bracket = '(' if lo_open else '['
        raise ValueError(f'{name} must be in {bracket}{lo}, {hi}], got {value}')
    return float(value)


def _check_eps_with_base(name: str, eps: float, base: Any) -> None:
    """``eps`` belongs to the default GRPO base; with an explicit base it goes there."""
    if base is not None and eps != 1e-8:
        raise ValueError(f'{name}: eps={eps} configures the default GRPO base; with base= set '
                         "it there instead, e.g. base=dict(type='GRPOAdvantage', eps=...)")


@dataclass
class EntropyThresholdState:
    """GEPO's adaptive entropy band, carried across steps and checkpointed.

    At step t, from the batch mean ``mu_t`` and population std ``sigma_t`` of the
    group entropies (the paper's Eq. 8, then the EMA of Eq. 9):

        Hhat_low(t)  = mu_t - beta_low  * sigma_t
        Hhat_high(t) = mu_t + beta_high * sigma_t
        H(t+1) = (1 - gamma) * H(t) + gamma * Hhat(t),   H(0) = Hhat(0)

    Shaping at step t uses ``H(t)``, the band before step t's batch is folded in.
    Values are Python floats (float64), so a checkpoint round trip is exact and a
    resumed run continues bit for bit.

    Attributes:
        beta_low, beta_high, gamma: the configuration the band is computed with.
        h_low, h_high: the current band H(t); None before the first update.
        num_updates: number of steps folded in so far.
    """

    beta_low: float
    beta_high: float
    gamma: float
    h_low: float | None = None
    h_high: float | None = None
    num_updates: int = 0

    def update(self, mu: float, sigma: float) -> tuple[float, float]:
        """Folds in one step's statistics; returns the band to shape this step with."""
        hat_low = mu - self.beta_low * sigma
        hat_high = mu + self.beta_high * sigma
        if self.num_updates == 0:
            self.h_low, self.h_high = hat_low, hat_high
        used = (self.h_low, self.h_high)
        g = self.gamma
        self.h_low = (1 - g) * self.h_low + g * hat_low
        self.h_high = (1 - g) * self.h_high + g * hat_high
        self.num_updates += 1
        return used

    def state_dict(self) -> dict[str, Any]:
        return dict(h_low=self.h_low, h_high=self.h_high, num_updates=self.num_updates,
                    config=dict(beta_low=self.beta_low, beta_high=self.beta_high,
                                gamma=self.gamma))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores the band; warns if it was computed with another configuration.

        Raises:
            KeyError: if ``state`` lacks a field (names the missing fields).
        """
        missing = {'h_low', 'h_high', 'num_updates', 'config'} - set(state)
        if missing:
            raise KeyError(f'GEPO threshold state is missing {sorted(missing)}; '
                           f'got keys {sorted(state)}')
        current = dict(beta_low=self.beta_low, beta_high=self.beta_high, gamma=self.gamma)
        if state['config'] != current:
            warnings.warn(f'GEPO thresholds were saved with {state["config"]} but this run '
                          f'uses {current}; continuing from the saved band with the new '
                          'configuration', stacklevel=2)
        self.h_low, self.h_high = state['h_low'], state['h_high']
        self.num_updates = int(state['num_updates'])


def band_initialisation_note(gamma: float) -> str:
    """What the band's initialisation ``H(0) = Hhat(0)`` means for a given ``gamma``.

    The first batch's statistics weigh ``(1 - gamma)^(t-1)`` in the band used at step
    ``t`` (``t >= 1``), so they anchor the thresholds for about ``1 / gamma`` steps.
    """
    half = 1 + math.log(0.5) / math.log1p(-gamma) if gamma < 1 else 1.0
    anchor = (1 - gamma) ** 99
    return (f'GEPO entropy band starts at the first batch\'s own statistics (H(0) = Hhat(0)): '
            f'with gamma={gamma:g} that batch still weighs {anchor:.2f} in the thresholds at '
            f'step 100 and half at step {half:.0f}, so an unrepresentative first batch '
            'anchors the band for about 1/gamma steps (warm-start the policy, or resume from '
            'a checkpoint that holds a band)')


def global_group_entropy_stats(entropy: Tensor, valid: Tensor) -> tuple[float, float, int]:
    """Mean and population std of group entropies over all data-parallel ranks.

    Reduces ``[count, sum H, sum H^2]`` (float64) with one all-reduce, so every rank
    gets identical values; each rank must hold whole groups.

    Args:
        entropy: ``(G,)`` float64 local group entropies.
        valid: ``(G,)`` bool, groups that have tokens.

    Returns:
        ``(mu, sigma, num_groups)``; ``(nan, nan, 0)`` if no rank has a valid group.
    """
    h = torch.where(valid, entropy, 0.0)
    sums = torch.stack([valid.to(torch.float64).sum(), h.sum(), (h * h).sum()])
    count, s1, s2 = all_reduce_sum(sums).tolist()
    if count == 0:
        return math.nan, math.nan, 0
    mu = s1 / count
    return mu, math.sqrt(max(s2 / count - mu * mu, 0.0)), int(count)


@ADVANTAGES.register_module()
class GEPOAdvantage(AdvantageShaper):
    """Group Entropy-Controlled Policy Optimization advantage shaping.

    Equation numbers are those of the paper ("Group Entropy-Controlled Policy
    Optimization"). Starts from the base estimator's advantages A_i (GRPO's Eq. 1
    unless ``base`` says otherwise) and the group entropy of Eq. 4, per token:
    ``H_g = sum_i sum_t (-lp_it) / sum_i T_i`` (from logprobs the step already has),
    then, with the adaptive band ``[H_low(t), H_high(t)]`` of
    :class:`EntropyThresholdState` (Eqs. 8-9), shapes them as Eq. 7:

        A_hat_i = alpha_low  * A_i   if A_i > 0 and H_g < H_low(t)
        A_hat_i = alpha_high * A_i   if A_i < 0 and H_g > H_high(t)
        A_hat_i = A_i                otherwise

    Low-entropy (already confident) groups get weaker positive reinforcement;
    high-entropy (exploring) groups get weaker negative suppression. Groups without
    tokens are left out of the statistics and never shaped. Paper ablations:
    ``alpha_low=1`` (w/o low-entropy control), ``alpha_high=1`` (w/o high-entropy
    control), ``alpha_low == alpha_high`` (w/o asymmetric shaping).

    Args:
        alpha_low: scale of positive advantages in low-entropy groups, in [0, 1].
            Paper: 0.5.
        alpha_high: scale of negative advantages in high-entropy groups, in [0, 1].
            Paper: 0.2 (alpha_high < alpha_low is the asymmetric setting).
        beta_low: lower margin in batch stds, >= 0. Paper: 0.2.
        beta_high: upper margin in batch stds, >= 0. Paper: 0.3.
        gamma: EMA rate of the band, in (0, 1]. Paper: 0.01.
        eps: the std guard of the default GRPO base. Default 1e-8.
        base: the estimator to shape, e.g. ``dict(type='RLOOAdvantage')``; None:
            ``GRPOAdvantage(eps=eps)``, the paper's setting.

    Requires a state from :meth:`init_state` and logprobs in the batch.
    """

    def __init__(self, alpha_low: float = 0.5, alpha_high: float = 0.2, beta_low: float = 0.2,
                 beta_high: float = 0.3, gamma: float = 0.01, eps: float = 1e-8,
                 base: dict | AdvantageEstimator | None = None) -> None:
        _check_eps_with_base(type(self).__name__, eps, base)
        super().__init__(base, default_eps=eps)
        self.eps = float(eps)
        self.alpha_low = _check('alpha_low', alpha_low, 0.0, 1.0)
        self.alpha_high = _check('alpha_high', alpha_high, 0.0, 1.0)
        self.beta_low = _check('beta_low', beta_low, 0.0, math.inf)
        self.beta_high = _check('beta_high', beta_high, 0.0, math.inf)
        self.gamma = _check('gamma', gamma, 0.0, 1.0, lo_open=True)

    def init_state(self) -> EntropyThresholdState:
        return EntropyThresholdState(self.beta_low, self.beta_high, self.gamma)

    state_type = EntropyThresholdState
    measures = 'group entropy'

    def start_note(self, state: EntropyThresholdState) -> str:
        """How the band starts: from this run's first batch, or from a checkpoint."""
        if state.num_updates:
            return (f'GEPO entropy band continues from the checkpoint: {state.num_updates} '
                    f'steps folded in, H = [{state.h_low:.4f}, {state.h_high:.4f}]')
        return band_initialisation_note(self.gamma)

    def shape(self, advantages: Tensor, groups: GroupView, batch: AdvantageInputs,
              state: EntropyThresholdState) -> Shaping:
        adv = advantages
        mu, sigma, count = global_group_entropy_stats(groups.entropy, groups.has_tokens)
        if count == 0:  # nothing to measure anywhere: leave the band untouched
            h_low, h_high = state.h_low, state.h_high
            low = high = torch.zeros_like(adv, dtype=torch.bool)
        else:
            h_low, h_high = state.update(mu, sigma)
            ent = groups.segments.broadcast(groups.entropy)  # NaN compares False
            low = (adv > 0) & (ent < h_low)
            high = (adv < 0) & (ent > h_high)
            adv = torch.where(low, adv * self.alpha_low, torch.where(high, adv * self.alpha_high,
                                                                      adv))
        nan = math.nan
        band = EntropyBand(nan if h_low is None else h_low, nan if h_high is None else h_high,
                           mu, sigma, count)
        metrics = {
            'gepo/h_low': band.low,
            'gepo/h_high': band.high,
            'gepo/group_nll_mu': mu,
            'gepo/group_nll_sigma': sigma,
            'gepo/num_groups': float(count),
            'gepo/num_updates': float(state.num_updates),
        }
        return Shaping(adv, low, high, torch.zeros_like(low), band, metrics)
