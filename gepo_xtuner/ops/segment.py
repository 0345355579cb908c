"""Segment (group-wise) reductions over a flat batch, with no Python loop over groups."""

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Segments:
    """Assignment of N items to G segments (e.g. responses to prompt groups).

    Attributes:
        index: ``(N,)`` long, segment of each item, in ``[0, G)``.
        counts: ``(G,)`` long, items per segment (every segment has at least one).
    """

    index: Tensor
    counts: Tensor

    @classmethod
    def from_ids(cls, ids: Tensor) -> 'Segments':
        """Builds segments from arbitrary integer ids (one sort, O(N log N))."""
        _, index, counts = torch.unique(ids, return_inverse=True, return_counts=True)
        return cls(index=index, counts=counts)

    @property
    def num_segments(self) -> int:
        return self.counts.shape[0]

    def sum(self, values: Tensor) -> Tensor:
        """``(N,) -> (G,)``: per-segment sum."""
        out = values.new_zeros(self.num_segments)
        return out.index_add_(0, self.index, values)

    def mean(self, values: Tensor) -> Tensor:
        """``(N,) -> (G,)``: per-segment mean."""
        return self.sum(values) / self.counts.to(values.dtype)

    def amin(self, values: Tensor) -> Tensor:
        """``(N,) -> (G,)``: per-segment minimum."""
        out = values.new_empty(self.num_segments)
        return out.scatter_reduce_(0, self.index, values, 'amin', include_self=False)

    def amax(self, values: Tensor) -> Tensor:
        """``(N,) -> (G,)``: per-segment maximum."""
        out = values.new_empty(self.num_segments)
        return out.scatter_reduce_(0, self.index, values, 'amax', include_self=False)

    def broadcast(self, per_segment: Tensor) -> Tensor:
        """``(G,) -> (N,)``: each item gets its segment's value."""
        return per_segment[self.index]


def moments(values: Tensor, index: Tensor, num_bins: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-bin count, mean, skewness and excess kurtosis (two scatter-add passes).

    Population (biased, moment-based) estimators, the convention behind the paper's
    appendix-A formula ``skew = (1 - 2p) / sqrt(p (1 - p))`` for a binary group:

        m_k = mean((x - mean)^k),  skew = m_3 / m_2^{3/2},  kurt = m_4 / m_2^2 - 3.

    Empty bins get NaN mean; empty or constant bins get NaN skewness and kurtosis.

    Args:
        values: ``(N,)`` float.
        index: ``(N,)`` long bin of each value, in ``[0, num_bins)``.
        num_bins: number of bins B.

    Returns:
        ``count, mean, skewness, kurtosis``, each ``(B,)`` float64.
    """
    x = values.to(torch.float64)
    n = x.new_zeros(num_bins).index_add_(0, index, torch.ones_like(x))
    mean = x.new_zeros(num_bins).index_add_(0, index, x) / n.clamp_min(1)
    d = x - mean[index]
    d2 = d * d
    central = x.new_zeros(num_bins, 3).index_add_(0, index, torch.stack([d2, d2 * d, d2 * d2], 1))
    m2, m3, m4 = (central / n.clamp_min(1)[:, None]).unbind(1)
    # A constant bin leaves only rounding noise in m2 (its mean is off by an ulp).
    constant = m2 <= 1e-24 * (mean * mean + 1e-300)
    nan = torch.full_like(m2, float('nan'))
    skew = torch.where(constant | (n < 1), nan, m3 / m2.clamp_min(1e-300)**1.5)
    kurt = torch.where(constant | (n < 1), nan, m4 / m2.clamp_min(1e-300)**2 - 3)
    return n, torch.where(n < 1, nan, mean), skew, kurt
