"""KL penalty to a frozen reference policy, estimated on the sampled tokens."""

import torch
from torch import Tensor

from gepo_xtuner.loss.aggregate import LOG_RATIO_CLAMP, aggregate

__all__ = ['kl_k3', 'reference_kl_loss']


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token ``k3`` estimate of ``KL(pi || pi_ref)`` from tokens sampled from ``pi``.

    With ``d = log pi_ref(y_t) - log pi(y_t)``: ``k3 = exp(d) - d - 1``, which is
    >= 0 for every token and unbiased for the KL under samples of ``pi``
    (Schulman, "Approximating KL divergence", 2020; the estimator GRPO's
    objective uses, Shao et al. 2024, eq. 4). ``d`` is clamped to
    ``[-20, 20]`` before ``exp``.

    Args:
        logprobs: ``(N, T)`` log-probabilities of the sampled tokens under the
            trained policy (with gradient).
        ref_logprobs: ``(N, T)`` the same under the reference policy (no gradient).

    Returns:
        ``(N, T)`` per-token estimates; padding positions hold garbage and must be
        masked by the caller.

    Example:
        >>> lp = torch.log(torch.tensor([[0.5, 0.25]]))
        >>> kl_k3(lp, lp)
        tensor([[0., 0.]])
    """
    d = (ref_logprobs - logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.expm1(d) - d


def reference_kl_loss(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, agg: str,
                      num_tokens=None, num_seqs=None, norm_length=None) -> Tensor:
    """``k3`` KL to the reference, reduced like the policy loss (:func:`aggregate`).

    Args:
        logprobs, ref_logprobs: ``(N, T)``, see :func:`kl_k3`.
        mask: ``(N, T)`` valid response tokens.
        agg, num_tokens, num_seqs, norm_length: as for the policy loss, so that micro-batches
            sum to the minibatch value.

    Returns:
        0-dim tensor ``>= 0``.
    """
    per_token = torch.where(mask.bool(), kl_k3(logprobs, ref_logprobs), 0)
    return aggregate(per_token, mask, agg, num_tokens, num_seqs, norm_length)
