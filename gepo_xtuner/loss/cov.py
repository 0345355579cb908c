"""Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement
Learning for Reasoning Language Models", arXiv:2505.22617): restrain the tokens whose
log-probability and advantage covary most, the driver of entropy collapse.
"""

import math
from typing import Optional

import torch
from torch import Tensor

from gepo_xtuner.loss.aggregate import PolicyInputs, check_number, masked_mean
from gepo_xtuner.loss.base import PolicyLoss, TokenLoss
from gepo_xtuner.loss.cispo import cispo_per_token
from gepo_xtuner.loss.ppo import ppo_clip_per_token
from gepo_xtuner.registry import POLICY_LOSSES

__all__ = ['ClipCovLoss', 'KLCovLoss', 'token_covariance']

_IMPORTANCE = ('ratio', 'cispo')


def token_covariance(inp: PolicyInputs) -> Tensor:
    """``(N, T)`` centred product ``(A_t - mean A) * (logp_t - mean logp)``.

    Means are over valid tokens, ``logp`` is detached, padded positions are 0.
    """
    lp = inp.logprobs.detach()
    adv_c = inp.advantages - masked_mean(inp.advantages, inp.mask)
    lp_c = lp - masked_mean(lp, inp.mask)
    return torch.where(inp.mask, adv_c * lp_c, torch.zeros_like(lp))


def _ranks(keys: Tensor, descending: bool) -> Tensor:
    """0-based position of every element of ``keys`` in a stable sort, same shape."""
    flat = keys.flatten()
    order = torch.argsort(flat, descending=descending, stable=True)
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(flat.numel(), device=flat.device)
    return ranks.view_as(keys)


class _CovLossBase(PolicyLoss):
    """Shared configuration and base surrogate; subclasses define ``_ratio_base``."""

    def __init__(self, importance: str, eps_low: float, eps_high: float, agg: str) -> None:
        super().__init__(agg)
        if importance not in _IMPORTANCE:
            raise ValueError(f'importance must be one of {list(_IMPORTANCE)}, '
                             f'got {importance!r}')
        self.importance = importance
        self.eps_low = check_number('eps_low', eps_low, 0.0)
        self.eps_high = check_number('eps_high', eps_high, 0.0)

    def _base(self, inp: PolicyInputs) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(per_token, clipped, clipped_low, clipped_high)`` of the base surrogate."""
        if self.importance == 'cispo':
            loss, low, high = cispo_per_token(inp.logprobs, inp.ratio, inp.advantages,
                                              self.eps_low, self.eps_high)
            return loss, low | high, low, high
        return self._ratio_base(inp)

    @staticmethod
    def _token_loss(inp: PolicyInputs, per_token: Tensor, flags: tuple[Tensor, ...],
                    selected: Tensor, cov: Tensor) -> TokenLoss:
        clipped, low, high = flags
        dtype = inp.ratio.dtype
        n_sel = selected.sum().to(dtype)
        metrics = {'loss/cov_tokens': n_sel,
                   'loss/cov_frac': n_sel / inp.mask.sum().to(dtype).clamp(min=1),
                   # 0 exactly when the centring set is degenerate (one response: A - mean A = 0)
                   'loss/cov_abs_mean': masked_mean(cov.abs(), inp.mask).detach()}
        return TokenLoss(per_token, dict(clipfrac=clipped, clipfrac_low=low, clipfrac_high=high),
                         metrics)


@POLICY_LOSSES.register_module()
class ClipCovLoss(_CovLossBase):
    """Clip-Cov: detach a few random high-covariance tokens (arXiv:2505.22617).

    Per call, over the ``N_valid`` valid tokens, with ``cov_t`` as in
    :func:`token_covariance`::

        C = {t valid : clip_cov_lb < cov_t < clip_cov_ub}
              minus the tokens clipped by the PPO clip ('ratio' mode only)
        n = max(1, floor(clip_cov_ratio * N_valid))
        S = min(n, |C|) tokens of C drawn uniformly without replacement
        l_t = 0 for t in S, else base_t

    and the loss is ``aggregate(l, mask, agg)``; tokens in ``S`` thus get no
    gradient. The base surrogate, with ``rho_t = exp(clamp(logp_t - logp_old_t,
    -20, 20))``, is ``importance='ratio'``: the PPO clip ``max(-A rho, -A clip(rho,
    1 - clip_low, 1 + clip_high))`` used by the authors, or ``'cispo'``:
    ``-sg(clip(rho, max(0, 1 - eps_low), 1 + eps_high)) * A * logp`` as in
    :class:`CISPOLoss` (the GEPO paper applies CISPO-style weight clipping to all
    baselines). ``n`` is counted as in the authors' code (floor, at least one).

    Defaults reproduce the authors' Qwen2.5-7B recipe: ``clip_cov_ratio=2e-4``,
    ``clip_cov_lb=1``, ``clip_cov_ub=5`` and a PPO clip of 1 on both sides
    (``clip_low = clip_high = 1``, range ``[0, 2]``, so that Clip-Cov rather than
    the PPO clip restrains updates); pass ``clip_low = clip_high = 0.2`` for the
    standard PPO clip.

    Args:
        clip_cov_ratio: Share ``r`` of valid tokens to detach, in ``[0, 1]``.
            Default 2e-4.
        clip_cov_lb: Exclusive lower covariance bound. Default 1.0.
        clip_cov_ub: Exclusive upper covariance bound, ``> clip_cov_lb``. Default 5.0.
        clip_low: PPO lower clip range (``'ratio'`` mode), in ``[0, 1]``. Default 1.0.
        clip_high: PPO upper clip range (``'ratio'`` mode), ``>= 0``. Default 1.0.
        importance: ``'ratio'`` or ``'cispo'`` (uses ``eps_*``). Default ``'ratio'``.
        eps_low: CISPO lower bound ``max(0, 1 - eps_low)``, ``>= 0``. Default 1.0.
        eps_high: CISPO upper bound ``1 + eps_high``, ``>= 0``. Default 4.0.
        agg: Aggregation mode, see :func:`~gepo_xtuner.loss.aggregate.aggregate`.
            Default ``'token-mean'``.
        seed: Seed in ``[0, 2**64)`` of a per-device ``torch.Generator`` that draws
            ``S`` (same seed and inputs on the same device: same selection), or
            ``None`` to use the global torch RNG. Default None.

    Call:
        Same as :class:`PPOClipLoss`. Metrics (detached 0-dim tensors):
        ``loss/pg``, ``ratio/mean|max|min``, ``loss/approx_kl``,
        ``loss/clipfrac|clipfrac_low|clipfrac_high`` of the base surrogate,
        ``loss/cov_tokens`` (``|S|``, float), ``loss/cov_frac`` (``|S| / N_valid``) and
        ``loss/cov_abs_mean`` (mean ``|cov_t|``: 0 when the centring set is degenerate).
    """

    def __init__(self, clip_cov_ratio: float = 2e-4, clip_cov_lb: float = 1.0,
                 clip_cov_ub: float = 5.0, clip_low: float = 1.0, clip_high: float = 1.0,
                 importance: str = 'ratio', eps_low: float = 1.0, eps_high: float = 4.0,
                 agg: str = 'token-mean', seed: Optional[int] = None) -> None:
        super().__init__(importance, eps_low, eps_high, agg)
        self.clip_cov_ratio = check_number('clip_cov_ratio', clip_cov_ratio, 0.0, 1.0)
        self.clip_cov_lb = check_number('clip_cov_lb', clip_cov_lb)
        self.clip_cov_ub = check_number('clip_cov_ub', clip_cov_ub, self.clip_cov_lb,
                                        low_open=True)
        self.clip_low = check_number('clip_low', clip_low, 0.0, 1.0)
        self.clip_high = check_number('clip_high', clip_high, 0.0)
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)
                                 or not 0 <= seed < 2**64):
            raise ValueError(f'seed must be None or an int in [0, 2**64), got {seed!r}')
        self.seed = seed
        self._generators: dict[str, torch.Generator] = {}

    def _ratio_base(self, inp: PolicyInputs) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return ppo_clip_per_token(inp.ratio, inp.advantages, self.clip_low, self.clip_high)

    def state_dict(self) -> dict[str, Tensor]:
        """The seeded generators' states by device (empty without ``seed``), so that a
        resumed run draws the same tokens as an uninterrupted one."""
        return {device: gen.get_state() for device, gen in self._generators.items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Restores what :meth:`state_dict` saved (generators are created as needed)."""
        if self.seed is None:
            return
        for device, gen_state in state.items():
            gen = self._generators.setdefault(device, torch.Generator(device))
            gen.set_state(gen_state)

    def _uniform(self, like: Tensor) -> Tensor:
        """Uniform [0, 1) noise shaped like ``like``, from the seeded generator if any."""
        gen, key = None, str(like.device)
        if self.seed is not None:
            if key not in self._generators:
                self._generators[key] = torch.Generator(like.device).manual_seed(self.seed)
            gen = self._generators[key]
        return torch.rand(like.shape, device=like.device, generator=gen)

    def per_token(self, inp: PolicyInputs) -> TokenLoss:
        base, clipped, low, high = self._base(inp)
        cov = token_covariance(inp)
        cand = inp.mask & (cov > self.clip_cov_lb) & (cov < self.clip_cov_ub)
        if self.importance == 'ratio':
            cand = cand & ~clipped
        n_valid = inp.mask.sum().to(cov.dtype)
        n = torch.floor(n_valid * self.clip_cov_ratio).clamp(min=1)
        # Candidates get uniform keys in [0, 1), the rest 2: the first min(n, |C|)
        # ranks are a uniform random subset of C. No host synchronisation needed.
        keys = torch.where(cand, self._uniform(cov), torch.full_like(cov, 2.0))
        selected = cand & (_ranks(keys, descending=False) < n)
        per_token = torch.where(selected, torch.zeros_like(base), base)
        return self._token_loss(inp, per_token, (clipped, low, high), selected, cov)


@POLICY_LOSSES.register_module()
class KLCovLoss(_CovLossBase):
    """KL-Cov: penalise the top-covariance tokens (arXiv:2505.22617).

    Per call, over the ``N_valid`` valid tokens, with ``cov_t`` as in
    :func:`token_covariance`::

        k   = min(N_valid, max(1, floor(kl_cov_ratio * N_valid)))   (0 if N_valid = 0)
        S   = the k valid tokens with the largest cov_t (ties: first in row-major order)
        l_t = base_t + ppo_kl_coef * |logp_t - logp_old_t|   for t in S
        l_t = base_t                                          otherwise

    and the loss is ``aggregate(l, mask, agg)``. The base surrogate, with ``rho_t =
    exp(clamp(logp_t - logp_old_t, -20, 20))``, is ``importance='ratio'``: the
    authors' unclipped ``-A rho``, or ``'cispo'``: ``-sg(clip(rho, max(0, 1 -
    eps_low), 1 + eps_high)) * A * logp`` as in :class:`CISPOLoss`. ``k`` is
    counted as in the authors' code (floor, at least one).

    Recipe: the authors' Qwen2.5-7B run uses ``kl_cov_ratio=2e-3`` (top 0.2% of
    tokens; 2e-4 for Qwen2.5-32B) and ``ppo_kl_coef=1``, which are the defaults.
    Note that verl's config defaults (``kl_cov_ratio=0.0002``, ``ppo_kl_coef=0.1``)
    do NOT match this recipe.

    Args:
        kl_cov_ratio: Share of valid tokens to penalise, in ``[0, 1]``. Default 2e-3.
        ppo_kl_coef: Penalty coefficient, ``>= 0``. Default 1.0.
        importance: ``'ratio'`` or ``'cispo'`` (uses ``eps_*``). Default ``'ratio'``.
        eps_low: CISPO lower bound ``max(0, 1 - eps_low)``, ``>= 0``. Default 1.0.
        eps_high: CISPO upper bound ``1 + eps_high``, ``>= 0``. Default 4.0.
        agg: Aggregation mode, see :func:`~gepo_xtuner.loss.aggregate.aggregate`.
            Default ``'token-mean'``.

    Call:
        Same as :class:`PPOClipLoss`. Metrics (detached 0-dim tensors):
        ``loss/pg``, ``ratio/mean|max|min``, ``loss/approx_kl``,
        ``loss/clipfrac|clipfrac_low|clipfrac_high`` of the base surrogate (always 0
        in ``'ratio'`` mode), ``loss/cov_tokens`` (``k``, float), ``loss/cov_frac``
        (``k / N_valid``), ``loss/cov_abs_mean`` (mean ``|cov_t|``) and
        ``loss/kl_cov_penalty`` (mean penalty over ``S``).
    """

    def __init__(self, kl_cov_ratio: float = 2e-3, ppo_kl_coef: float = 1.0,
                 importance: str = 'ratio', eps_low: float = 1.0, eps_high: float = 4.0,
                 agg: str = 'token-mean') -> None:
        super().__init__(importance, eps_low, eps_high, agg)
        self.kl_cov_ratio = check_number('kl_cov_ratio', kl_cov_ratio, 0.0, 1.0)
        self.ppo_kl_coef = check_number('ppo_kl_coef', ppo_kl_coef, 0.0)

    def _ratio_base(self, inp: PolicyInputs) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        none = torch.zeros_like(inp.mask)
        return -inp.advantages * inp.ratio, none, none, none

    def per_token(self, inp: PolicyInputs) -> TokenLoss:
        base, clipped, low, high = self._base(inp)
        cov = token_covariance(inp)
        n_valid = inp.mask.sum().to(cov.dtype)
        k = torch.floor(n_valid * self.kl_cov_ratio).clamp(min=1).minimum(n_valid)
        keys = torch.where(inp.mask, cov, torch.full_like(cov, -math.inf))
        selected = inp.mask & (_ranks(keys, descending=True) < k)
        penalty = self.ppo_kl_coef * (inp.logprobs - inp.old_logprobs).abs()
        per_token = base + torch.where(selected, penalty, torch.zeros_like(penalty))
        out = self._token_loss(inp, per_token, (clipped, low, high), selected, cov)
        out.metrics['loss/kl_cov_penalty'] = masked_mean(penalty.detach(), selected)
        return out
