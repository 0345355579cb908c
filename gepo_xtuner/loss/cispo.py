"""CISPO: clipped importance-sampling-weight policy optimisation (MiniMax-M1)."""

from torch import Tensor

from gepo_xtuner.loss.aggregate import PolicyInputs, check_number
from gepo_xtuner.loss.base import PolicyLoss, TokenLoss
from gepo_xtuner.registry import POLICY_LOSSES

__all__ = ['CISPOLoss', 'cispo_bounds', 'cispo_per_token']


def cispo_bounds(eps_low: float, eps_high: float) -> tuple[float, float]:
    """Weight bounds ``(max(0, 1 - eps_low), 1 + eps_high)``."""
    return max(0.0, 1.0 - eps_low), 1.0 + eps_high


def cispo_per_token(logprobs: Tensor, ratio: Tensor, advantages: Tensor, eps_low: float,
                    eps_high: float) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token CISPO loss ``-sg(clip(rho, lo, hi)) * A * logp``.

    Args:
        logprobs: ``(N, T)`` current log-probs ``logp`` (differentiable).
        ratio: ``(N, T)`` importance ratio ``rho`` (detached here).
        advantages: ``(N, T)`` advantages ``A``.
        eps_low, eps_high: Bounds ``lo = max(0, 1 - eps_low)``, ``hi = 1 + eps_high``.

    Returns:
        ``(loss, clipped_low, clipped_high)``, all ``(N, T)``: the per-token loss
        and where ``rho < lo`` / ``rho > hi`` (the weight was clipped).
    """
    lo, hi = cispo_bounds(eps_low, eps_high)
    ratio = ratio.detach()
    weight = ratio.clamp(lo, hi)
    return -weight * advantages * logprobs, ratio < lo, ratio > hi


@POLICY_LOSSES.register_module()
class CISPOLoss(PolicyLoss):
    """CISPO loss (MiniMax-M1, MiniMax 2025, arXiv:2506.13585).

    PPO drops the gradient of every token whose ratio leaves the clip range.
    CISPO instead clips the importance-sampling *weight*, stops its gradient and
    uses it to scale a REINFORCE term, so every token keeps a gradient. With
    ``rho_t = exp(clamp(logp_t - logp_old_t, -20, 20))`` (the clamp only guards
    ``exp`` against overflow), per valid token::

        w_t = sg(clip(rho_t, max(0, 1 - eps_low), 1 + eps_high))
        l_t = -w_t * A_t * logp_t

    (``sg`` = stop-gradient) and the loss is ``aggregate(l, mask, agg)``. Hence
    ``dl_t/dlogp_t = -w_t * A_t``; for an unclipped token this is ``-rho_t * A_t``,
    the gradient of PPO's surrogate ``-A_t * rho_t``. The loss *value* is not the
    PPO surrogate value (it contains ``logp``); only its gradient is meaningful.

    Bounds and recipes: MiniMax-M1 tunes only the upper bound and sets ``eps_low``
    large, i.e. applies no lower bound; hence the default ``eps_low=1.0``
    (lower bound 0, inactive because ``rho > 0``) and ``eps_high=4.0`` (upper
    bound 5, slime's recommendation). Other published settings: verl's CISPO
    example uses ``clip_ratio_low=10`` (lower bound disabled) and
    ``clip_ratio_high=0.2``, i.e. ``eps_low=10, eps_high=0.2`` (upper bound 1.2);
    NeMo-RL clamps the weight to ``[0, 6]``, i.e. ``eps_low=1, eps_high=5``.

    Args:
        eps_low: Lower bound is ``max(0, 1 - eps_low)``; ``>= 0``, values ``>= 1``
            disable it (the bound is clamped at 0). Default 1.0.
        eps_high: Upper bound is ``1 + eps_high``; ``>= 0`` (``inf`` disables it).
            Default 4.0.
        agg: Aggregation mode, see :func:`~gepo_xtuner.loss.aggregate.aggregate`.
            Default ``'token-mean'``.

    Call: see :class:`~gepo_xtuner.loss.base.PolicyLoss`. Metrics (detached 0-dim tensors): ``loss/pg``, ``ratio/mean|max|min``,
        ``loss/approx_kl``, ``loss/clipfrac`` (share of valid tokens whose weight
        was clipped), ``loss/clipfrac_low`` (``rho`` below the lower bound),
        ``loss/clipfrac_high`` (``rho`` above the upper bound).
    """

    def __init__(self, eps_low: float = 1.0, eps_high: float = 4.0,
                 agg: str = 'token-mean') -> None:
        super().__init__(agg)
        self.eps_low = check_number('eps_low', eps_low, 0.0)
        self.eps_high = check_number('eps_high', eps_high, 0.0)

    def per_token(self, inp: PolicyInputs) -> TokenLoss:
        per_token, low, high = cispo_per_token(inp.logprobs, inp.ratio, inp.advantages,
                                               self.eps_low, self.eps_high)
        return TokenLoss(per_token, dict(clipfrac=low | high, clipfrac_low=low,
                                         clipfrac_high=high))
