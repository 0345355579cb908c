"""Ragged per-response values (one list per response, lengths differ) as a padded batch."""

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ['pad_ragged']


def pad_ragged(rows: Sequence[Sequence[float]], *, dtype: torch.dtype = torch.float32,
               pad_value: float = 0.0, min_width: int = 1) -> tuple[Tensor, Tensor]:
    """Left-aligned rows of different lengths as one tensor and the mask of real entries.

    Args:
        rows: ``N`` sequences of numbers (e.g. one response's token log-probabilities),
            of lengths ``L_i >= 0``.
        dtype: the values' dtype.
        pad_value: the value of the positions past a row's end.
        min_width: the least width ``T``; the default 1 gives a batch of empty rows one
            masked-out column, so reductions over the token axis stay defined.

    Returns:
        ``(values, mask)``, both of shape ``(N, T)`` with
        ``T = max(min_width, max_i L_i)``: ``values[i, :L_i]`` is row ``i`` and
        ``values[i, L_i:]`` is ``pad_value``; ``mask`` (bool) is True exactly on
        ``[i, :L_i]``.
    """
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
    width = max([min_width, *lengths.tolist()])
    values = torch.full((len(rows), width), pad_value, dtype=dtype)
    mask = torch.arange(width) < lengths[:, None]
    if mask.any():
        # One copy of all rows at once, in row order, which is the mask's order.
        values[mask] = torch.tensor([x for row in rows for x in row], dtype=dtype)
    return values, mask
