"""Group-relative advantage estimators: GRPO, Dr.GRPO and RLOO."""

import torch
from torch import Tensor

from ..ops.segment import Segments
from ..registry import ADVANTAGES
from .base import AdvantageEstimator


def _check_eps(eps: float) -> float:
    if not eps > 0:
        raise ValueError(f'eps must be > 0 (it guards the std division), got {eps}')
    return float(eps)


@ADVANTAGES.register_module()
class GRPOAdvantage(AdvantageEstimator):
    """GRPO's group-normalised advantage (Shao et al., 2024, arXiv 2402.03300).

    For group g with K responses and rewards r_1..r_K:

        A_i = (r_i - mean_g(r)) / (std_g(r) + eps)

    with the Bessel-corrected standard deviation (divide by K - 1), as XTuner v1's
    ``GRPOEstimator``. A group of one response, or whose rewards are all equal,
    carries no relative signal and gets A = 0 exactly.

    Args:
        eps: added to the std before dividing. Default 1e-8.
    """

    min_group_size = 2

    def __init__(self, eps: float = 1e-8) -> None:
        self.eps = _check_eps(eps)

    def estimate(self, rewards: Tensor, segments: Segments) -> Tensor:
        mean = segments.mean(rewards)
        centered = rewards - segments.broadcast(mean)
        k = segments.counts.to(rewards.dtype)
        var = segments.sum(centered * centered) / (k - 1).clamp_min(1)
        scale = var.sqrt() + self.eps
        no_signal = segments.amax(rewards) == segments.amin(rewards)
        adv = centered / segments.broadcast(scale)
        return torch.where(segments.broadcast(no_signal), 0.0, adv)


@ADVANTAGES.register_module()
class DrGRPOAdvantage(AdvantageEstimator):
    """Dr.GRPO's advantage: GRPO without the std division (Liu et al., 2025, arXiv 2503.20783).

        A_i = r_i - mean_g(r)

    Dividing by the group std up-weights prompts that are nearly always solved or
    nearly always failed; Dr.GRPO removes that bias. (XTuner v1's
    ``DrGRPOEstimator`` still divides by the std; this one does not.) Groups of one
    response or with equal rewards get exactly 0.
    """

    min_group_size = 2

    def estimate(self, rewards: Tensor, segments: Segments) -> Tensor:
        adv = rewards - segments.broadcast(segments.mean(rewards))
        no_signal = segments.amax(rewards) == segments.amin(rewards)
        return torch.where(segments.broadcast(no_signal), 0.0, adv)


@ADVANTAGES.register_module()
class RLOOAdvantage(AdvantageEstimator):
    """REINFORCE leave-one-out (Ahmadian et al., 2024, arXiv 2402.14740).

    Each response's baseline is the mean reward of the other K - 1 responses:

        A_i = r_i - (sum_j r_j - r_i) / (K - 1) = K / (K - 1) * (r_i - mean_g(r))

    A group of one response has no baseline and gets A = 0; equal rewards give 0.
    """

    min_group_size = 2

    def estimate(self, rewards: Tensor, segments: Segments) -> Tensor:
        k = segments.counts.to(rewards.dtype)
        loo_mean = (segments.broadcast(segments.sum(rewards)) - rewards) / segments.broadcast(
            (k - 1).clamp_min(1))
        no_signal = (segments.amax(rewards) == segments.amin(rewards)) | (k < 2)
        return torch.where(segments.broadcast(no_signal), 0.0, rewards - loo_mean)
