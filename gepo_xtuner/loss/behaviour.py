"""Behaviour-policy correction for overlapped (stale) rollouts.

Three policies meet once generation runs ahead of training:

- ``mu``, the behaviour policy: the weights the rollout engine sampled with (its per-token
  logprobs come back with the samples, ``ResponseBatch.rollout_logprobs``);
- ``pi_prox``, the proximal policy: the trainer's weights when the batch is trained (its
  logprobs are the recomputed old logprobs, ``engine.update.old_logprobs``);
- ``pi_theta``, the policy being updated.

Every policy loss takes its ratio against ``pi_prox``: ``r_t = pi_theta / pi_prox`` (PPO's
clip, CISPO's clipped weight, Clip-Cov / KL-Cov alike). The behaviour weight of a token is
the constant (no gradient)::

    w_t = pi_prox(y_t) / mu(y_t) = exp(clamp(logp_prox_t - logp_mu_t, -20, 20))

and a correction mode (``train_cfg.behaviour_correction``) with a cap ``C > 1``
(``train_cfg.behaviour_cap``) turns it into the loss's weights:

- ``'none'``: nothing is computed; the loss is the uncorrected one.
- ``'truncate'`` (decoupled PPO, Hilton et al. 2021, arXiv:2110.00641; truncated
  importance sampling): the per-token loss ``l_t`` becomes ``min(w_t, C) * l_t``; the
  denominators are unchanged.
- ``'mask'``: tokens with ``w_t`` outside ``[1/C, C]`` leave the loss and its
  denominators (they count as padding); kept tokens weigh 1.

With ``mu = pi_prox`` (no staleness, no engine/trainer mismatch) ``w_t = exp(0) = 1``
exactly, ``min(1, C) = 1`` and ``1 * l_t = l_t`` bit for bit, so ``'truncate'`` gives the
uncorrected loss and ``'mask'`` keeps every token.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from gepo_xtuner.loss.aggregate import LOG_RATIO_CLAMP, check_number

__all__ = ['BEHAVIOUR_CORRECTIONS', 'BehaviourCorrection', 'behaviour_weights',
           'check_behaviour_correction']

BEHAVIOUR_CORRECTIONS = ('none', 'truncate', 'mask')
"""Valid values of ``train_cfg.behaviour_correction``."""


def check_behaviour_correction(mode: str, cap: float) -> float:
    """Validates a correction mode and its cap; returns the cap as ``float``.

    Raises:
        ValueError: naming ``train_cfg.behaviour_correction`` and its allowed values, or
            ``train_cfg.behaviour_cap`` and its range ``(1, inf)``.
    """
    if mode not in BEHAVIOUR_CORRECTIONS:
        raise ValueError(f'train_cfg.behaviour_correction must be one of '
                         f'{list(BEHAVIOUR_CORRECTIONS)}, got {mode!r}')
    return check_number('train_cfg.behaviour_cap', cap, 1.0, math.inf, low_open=True,
                        high_open=True)


def behaviour_weights(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-token behaviour weights ``w = pi_prox / mu``, before any cap.

    ``w_t = exp(clamp(old_logprobs_t - rollout_logprobs_t, -20, 20))`` at valid tokens
    (the clamp only guards ``exp``; ``w`` lies in about ``[2e-9, 4.9e8]``), exactly 1 at
    padding (whatever the inputs hold there).

    Args:
        old_logprobs: ``(N, R)`` proximal-policy logprobs (the trainer's recomputed ones).
        rollout_logprobs: ``(N, R)`` behaviour-policy logprobs (the rollout engine's).
        mask: ``(N, R)`` bool, valid response tokens.

    Returns:
        ``(N, R)`` float32 (or wider, following the inputs), detached.

    Raises:
        ValueError: on mismatched shapes.
    """
    if not old_logprobs.shape == rollout_logprobs.shape == mask.shape:
        raise ValueError('old_logprobs, rollout_logprobs and mask must have one shape (N, R), '
                         f'got {tuple(old_logprobs.shape)}, {tuple(rollout_logprobs.shape)}, '
                         f'{tuple(mask.shape)}')
    dtype = torch.promote_types(torch.promote_types(old_logprobs.dtype, rollout_logprobs.dtype),
                                torch.float32)
    valid = mask.bool()
    log_w = (old_logprobs.detach().to(dtype) - rollout_logprobs.detach().to(dtype))
    log_w = torch.where(valid, log_w, torch.zeros((), dtype=dtype, device=log_w.device))
    return torch.exp(log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


@dataclass(frozen=True)
class BehaviourCorrection:
    """The behaviour correction of one batch of ``N`` responses of width ``R``.

    Build it with :meth:`of`. Constant across the PPO epochs of a batch: neither
    ``pi_prox`` nor ``mu`` changes while it is trained.

    Attributes:
        mode: ``'truncate'`` or ``'mask'`` (``'none'`` builds no correction).
        cap: ``C > 1``.
        weights: ``(N, R)`` ``w = pi_prox / mu`` before the cap, 1 at padding.
        mask: ``(N, R)`` bool, the valid response tokens ``w`` was computed on.
        outside: ``(N, R)`` bool, valid tokens the cap acts on: ``w > C`` (truncate) or
            ``w`` outside ``[1/C, C]`` (mask).
    """

    mode: str
    cap: float
    weights: Tensor
    mask: Tensor
    outside: Tensor

    @classmethod
    def of(cls, old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, mode: str,
           cap: float) -> 'BehaviourCorrection | None':
        """The correction of a batch, or None for ``mode='none'`` (nothing is computed).

        Args:
            old_logprobs: ``(N, R)`` proximal-policy logprobs ``log pi_prox``.
            rollout_logprobs: ``(N, R)`` behaviour-policy logprobs ``log mu``.
            mask: ``(N, R)`` bool, valid response tokens.
            mode: one of :data:`BEHAVIOUR_CORRECTIONS`.
            cap: ``C > 1``.

        Raises:
            ValueError: an unknown mode, a cap not in ``(1, inf)``, mismatched shapes.
        """
        cap = check_behaviour_correction(mode, cap)
        if mode == 'none':
            return None
        valid = mask.bool()
        w = behaviour_weights(old_logprobs, rollout_logprobs, valid)
        if mode == 'truncate':
            outside = valid & (w > cap)
        else:
            outside = valid & ((w < 1.0 / cap) | (w > cap))
        return cls(mode, cap, w, valid, outside)

    @property
    def loss_weights(self) -> Tensor | None:
        """``(N, R)`` ``min(w, C)`` that multiplies each token's loss (truncate), else None."""
        return self.weights.clamp(max=self.cap) if self.mode == 'truncate' else None

    @property
    def loss_mask(self) -> Tensor | None:
        """``(N, R)`` bool, the tokens the loss and its denominators count (mask): valid
        tokens with ``1/C <= w <= C``; None in truncate mode (every valid token counts)."""
        return self.mask & ~self.outside if self.mode == 'mask' else None

    def metric_sums(self, rows: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Sums for the ``offpolicy/*`` metrics over ``rows`` (default all), to all-reduce.

        Returns:
            ``(sums, max)``: float64 ``(3,)`` ``[sum of w, tokens outside, valid tokens]``
            over the valid tokens, and float64 ``(1,)`` the largest ``w`` (``-inf`` with no
            valid token).
        """
        w, valid, outside = self.weights, self.mask, self.outside
        if rows is not None:
            w, valid, outside = w[rows], valid[rows], outside[rows]
        w = w.to(torch.float64)
        sums = torch.stack([torch.where(valid, w, 0.0).sum(), outside.sum().to(torch.float64),
                            valid.sum().to(torch.float64)])
        top = torch.where(valid, w, -math.inf).amax() if w.numel() else \
            torch.tensor(-math.inf, dtype=torch.float64)
        return sums, top.reshape(1)

    @staticmethod
    def metrics(mode: str, sums: Tensor, top: Tensor) -> dict[str, float]:
        """``offpolicy/weight_mean`` (mean ``w`` over valid tokens, before the cap),
        ``offpolicy/weight_max``, and ``offpolicy/frac_truncated`` (share of valid tokens
        with ``w > C``, truncate) or ``offpolicy/frac_masked`` (share outside ``[1/C, C]``,
        mask), from :meth:`metric_sums` reduced over ranks (sum, max). Left out where no
        token was valid."""
        total, outside, tokens = (float(v) for v in sums)
        if tokens <= 0:
            return {}
        frac = 'offpolicy/frac_truncated' if mode == 'truncate' else 'offpolicy/frac_masked'
        return {'offpolicy/weight_mean': total / tokens, 'offpolicy/weight_max': float(top[0]),
                frac: outside / tokens}
