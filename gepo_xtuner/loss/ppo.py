"""PPO clipped surrogate (with optional dual clip) as a policy loss."""

from typing import Optional

import torch
from torch import Tensor

from gepo_xtuner.loss.aggregate import PolicyInputs, check_number
from gepo_xtuner.loss.base import PolicyLoss, TokenLoss
from gepo_xtuner.registry import POLICY_LOSSES

__all__ = ['PPOClipLoss', 'ppo_clip_per_token']


def ppo_clip_per_token(ratio: Tensor, advantages: Tensor, clip_low: float,
                       clip_high: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-token PPO clipped surrogate ``max(-A rho, -A clip(rho, 1-cl, 1+ch))``.

    Args:
        ratio: ``(N, T)`` importance ratio ``rho`` (differentiable).
        advantages: ``(N, T)`` advantages ``A``.
        clip_low: ``cl``; clip_high: ``ch``.

    Returns:
        ``(loss, clipped, clipped_low, clipped_high)``, all ``(N, T)``: the
        per-token loss, where the clipped branch is the larger one (``l2 > l1``;
        those tokens get no gradient), where ``rho < 1-cl`` with ``A < 0`` and
        where ``rho > 1+ch`` with ``A > 0``.
    """
    l1 = -advantages * ratio
    l2 = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    clipped = l2 > l1
    clipped_low = (ratio < 1.0 - clip_low) & (advantages < 0)
    clipped_high = (ratio > 1.0 + clip_high) & (advantages > 0)
    return torch.where(clipped, l2, l1), clipped, clipped_low, clipped_high


@POLICY_LOSSES.register_module()
class PPOClipLoss(PolicyLoss):
    """PPO clipped policy-gradient loss (Schulman et al. 2017, arXiv:1707.06347).

    With ``rho_t = exp(clamp(logp_t - logp_old_t, -20, 20))`` (the clamp only
    guards ``exp`` against overflow) and advantage ``A_t``, per valid token::

        l1_t = -A_t * rho_t
        l2_t = -A_t * clip(rho_t, 1 - clip_low, 1 + clip_high)
        l_t  = max(l1_t, l2_t)
        l_t  = min(l_t, -A_t * dual_clip)     if dual_clip is set and A_t < 0

    and the loss is ``aggregate(l, mask, agg)``. Tokens on the clipped branch
    (``l2 > l1``) and dual-clipped tokens contribute no gradient. Dual clip (Ye et
    al. 2020, "Mastering Complex Control in MOBA Games with Deep RL",
    arXiv:1912.09729) bounds the loss of negative-advantage tokens whose ratio
    exceeds ``dual_clip``, which otherwise grows without limit.

    Recipes: standard PPO / GRPO use ``clip_low = clip_high = 0.2``; DAPO
    ("Clip-Higher", Yu et al. 2025, arXiv:2503.14476) uses ``clip_low=0.2,
    clip_high=0.28`` to let low-probability tokens grow and slow entropy collapse;
    verl's dual-clip constant ``clip_ratio_c`` defaults to 3.0.

    Args:
        clip_low: Lower clip range, ``rho`` is clipped below at ``1 - clip_low``;
            in ``[0, 1]``. Default 0.2.
        clip_high: Upper clip range, ``rho`` is clipped above at ``1 + clip_high``;
            ``>= 0``. Default 0.2 (DAPO: 0.28).
        dual_clip: Dual-clip constant ``c > 1`` or ``None`` to disable. Default None.
        agg: Aggregation mode, see :func:`~gepo_xtuner.loss.aggregate.aggregate`.
            Default ``'token-mean'``.

    Call: see :class:`~gepo_xtuner.loss.base.PolicyLoss`. Metrics (detached 0-dim tensors): ``loss/pg``, ``ratio/mean|max|min``,
        ``loss/approx_kl``, ``loss/clipfrac`` (share of valid tokens with
        ``l2 > l1``), ``loss/clipfrac_low`` (``rho < 1-clip_low`` and ``A < 0``),
        ``loss/clipfrac_high`` (``rho > 1+clip_high`` and ``A > 0``),
        ``loss/dual_clipfrac`` (share where dual clip was active; 0 if disabled).
    """

    def __init__(self, clip_low: float = 0.2, clip_high: float = 0.2,
                 dual_clip: Optional[float] = None, agg: str = 'token-mean') -> None:
        super().__init__(agg)
        self.clip_low = check_number('clip_low', clip_low, 0.0, 1.0)
        self.clip_high = check_number('clip_high', clip_high, 0.0)
        self.dual_clip = (None if dual_clip is None else
                          check_number('dual_clip', dual_clip, 1.0, low_open=True))

    def per_token(self, inp: PolicyInputs) -> TokenLoss:
        adv = inp.advantages
        per_token, clipped, low, high = ppo_clip_per_token(
            inp.ratio, adv, self.clip_low, self.clip_high)
        if self.dual_clip is not None:
            bound = -adv * self.dual_clip
            dual = (adv < 0) & (per_token > bound)
            per_token = torch.where(dual, bound, per_token)
        else:
            dual = torch.zeros_like(inp.mask)
        return TokenLoss(per_token, dict(clipfrac=clipped, clipfrac_low=low, clipfrac_high=high,
                                         dual_clipfrac=dual))
