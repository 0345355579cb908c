"""Masked reductions and input handling shared by the policy losses.

Every policy loss computes a per-token loss of shape ``(N, T)`` (``N`` responses,
``T`` response positions) and reduces it over the valid tokens with
:func:`aggregate`. All reductions here are masked with ``torch.where`` rather than
multiplication, so non-finite values at padded positions never leak into the
result and receive exactly zero gradient, and an all-padding batch gives a loss of
exactly 0 that is still attached to the autograd graph. None of them synchronises with the
device (no ``.item()``, no data-dependent Python branching).
"""

import math
from numbers import Real
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ['AGG_MODES', 'LOG_RATIO_CLAMP', 'PolicyInputs', 'aggregate', 'check_agg',
           'check_number', 'flag_fractions', 'masked_mean', 'prepare_inputs', 'ratio_metrics']

AGG_MODES = ('token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum-norm')
"""Valid values of the ``agg`` / ``mode`` argument."""

LOG_RATIO_CLAMP = 20.0
"""``log rho`` is clamped to ``[-20, 20]`` before ``exp`` (``rho`` in about
``[2e-9, 4.9e8]``) so that one stale token cannot overflow the ratio; the clamp
has zero gradient outside that range, which no sane update ever reaches."""


def check_number(name: str, value, low: float = -math.inf, high: float = math.inf,
                 *, low_open: bool = False, high_open: bool = False) -> float:
    """Validate a real-valued hyper-parameter and return it as ``float``.

    Raises:
        ValueError: naming ``name``, the bad value and the allowed range when
            ``value`` is not a real number (``bool`` and NaN are rejected) or lies
            outside ``low .. high`` (bounds open where ``low_open`` / ``high_open``).
    """
    lb, rb = ('(' if low_open else '['), (')' if high_open else ']')
    allowed = f'{lb}{low}, {high}{rb}'
    ok = isinstance(value, Real) and not isinstance(value, bool)
    if ok:
        v = float(value)
        ok = (not math.isnan(v) and (v > low if low_open else v >= low)
              and (v < high if high_open else v <= high))
    if not ok:
        raise ValueError(f'{name} must be a real number in {allowed}, got {value!r}')
    return float(value)


def check_agg(mode) -> str:
    """Return ``mode`` if it is one of :data:`AGG_MODES`, else raise ``ValueError``."""
    if mode not in AGG_MODES:
        raise ValueError(f'agg must be one of {list(AGG_MODES)}, got {mode!r}')
    return mode


def _denominator(override, default: Tensor, name: str) -> Tensor:
    """``override`` (number or tensor) or ``default``, as a tensor clamped to >= 1."""
    if override is None:
        return default.clamp(min=1)
    if not isinstance(override, Tensor):
        check_number(name, override, 0.0)
    return torch.as_tensor(override, dtype=default.dtype, device=default.device).clamp(min=1)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` is set; 0 for an empty mask.

    Args:
        x: Values, any shape.
        mask: Same shape as ``x``; bool or 0/1 float (non-zero = valid).

    Returns:
        0-dim tensor of ``x``'s dtype, connected to ``x``'s graph.
    """
    valid = mask.bool()
    total = torch.where(valid, x, torch.zeros_like(x)).sum()
    return total / valid.sum().to(total.dtype).clamp(min=1)


def aggregate(per_token: Tensor, mask: Tensor, mode: str, num_tokens=None,
              num_seqs=None, norm_length=None) -> Tensor:
    """Reduce a per-token loss to a scalar over the valid tokens.

    Modes:
        ``'token-mean'``: ``sum_{i,t} m_it l_it / D`` with ``D = sum m_it`` (every
        valid token weighs the same). ``num_tokens`` replaces ``D``: pass the
        number of valid tokens of the whole minibatch when accumulating gradients
        over micro-batches, so that the summed micro-batch losses equal the
        minibatch token mean.

        ``'seq-mean-token-mean'``: ``sum_i mean_t(l_i) / S`` over the rows with at
        least one valid token, ``S`` = their number (every response weighs the
        same); ``num_seqs`` replaces ``S`` in the same way.

        ``'seq-mean-token-sum-norm'``: ``sum_{i,t} m_it l_it / (S * L)`` with a
        CONSTANT ``L = norm_length`` (default ``T``, the padded width): Dr.GRPO's
        aggregation (Liu et al. 2025, arXiv 2503.20783; verl's mode of the same
        name), which removes the ``1/|o_i|`` length bias of the per-response mean.
        Dr.GRPO takes ``L`` = the generation length cap; pass it, since ``T``
        changes with every micro-batch. ``S`` and ``num_seqs`` as above.

        With micro-batches and data-parallel ranks, pass the counts of the whole
        minibatch over ALL ranks: the micro-batch losses then sum, over
        micro-batches and ranks, to the loss of one big batch (the caller undoes
        the data-parallel gradient averaging, see ``RLTrainLoop``).

    Denominators are clamped to at least 1, so an empty mask gives exactly 0.

    Args:
        per_token: Per-token loss, shape ``(N, T)``.
        mask: Valid tokens, shape ``(N, T)``, bool or 0/1 float.
        mode: One of :data:`AGG_MODES`.
        num_tokens: Optional token-mean denominator (number >= 0 or tensor).
        num_seqs: Optional seq-mean denominator (number >= 0 or tensor).
        norm_length: ``L`` of ``'seq-mean-token-sum-norm'`` (number > 0); ignored
            by the other modes.

    Returns:
        0-dim loss tensor (dtype of ``per_token``).

    Raises:
        ValueError: on an unknown ``mode``, mismatched shapes or a negative override.
    """
    check_agg(mode)
    if per_token.dim() != 2 or mask.shape != per_token.shape:
        raise ValueError('per_token and mask must both have shape (N, T), got '
                         f'{tuple(per_token.shape)} and {tuple(mask.shape)}')
    valid = mask.bool()
    masked = torch.where(valid, per_token, torch.zeros_like(per_token))
    counts = valid.sum(dim=-1).to(per_token.dtype)  # (N,)
    if mode == 'token-mean':
        return masked.sum() / _denominator(num_tokens, counts.sum(), 'num_tokens')
    n_seqs = (counts > 0).sum().to(per_token.dtype)
    seqs = _denominator(num_seqs, n_seqs, 'num_seqs')
    if mode == 'seq-mean-token-sum-norm':
        length = per_token.shape[-1] if norm_length is None else check_number(
            'norm_length', norm_length, 0.0, low_open=True)
        return masked.sum() / (seqs * max(length, 1))
    seq_means = masked.sum(dim=-1) / counts.clamp(min=1)  # (N,), 0 for empty rows
    return seq_means.sum() / seqs


class PolicyInputs(NamedTuple):
    """Validated loss inputs, all ``(N, T)`` in the compute dtype (>= float32).

    At padded positions ``logprobs``, ``old_logprobs``, ``log_ratio`` and
    ``advantages`` are 0 and ``ratio`` is 1, so every per-token term there is finite.
    """
    logprobs: Tensor      # current policy, differentiable
    old_logprobs: Tensor  # old (proximal) policy pi_prox, detached
    log_ratio: Tensor     # clamp(logprobs - old_logprobs, +-LOG_RATIO_CLAMP)
    ratio: Tensor         # exp(log_ratio)
    advantages: Tensor    # detached, broadcast to (N, T)
    mask: Tensor          # bool


def prepare_inputs(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
                   mask: Tensor) -> PolicyInputs:
    """Check shapes, cast to >= float32, broadcast advantages and mask padding.

    Args:
        logprobs: ``(N, T)`` current-policy log-probs (requires grad).
        old_logprobs: ``(N, T)`` old (proximal) policy log-probs (detached here).
        advantages: ``(N,)`` per response or ``(N, T)`` per token (detached here).
        mask: ``(N, T)`` bool or 0/1 float.

    Raises:
        ValueError: on inconsistent shapes.
    """
    if logprobs.dim() != 2:
        raise ValueError(f'logprobs must have shape (N, T), got {tuple(logprobs.shape)}')
    shape = logprobs.shape
    for name, t in (('old_logprobs', old_logprobs), ('mask', mask)):
        if t.shape != shape:
            raise ValueError(f'{name} must have shape {tuple(shape)} like logprobs, '
                             f'got {tuple(t.shape)}')
    if advantages.shape == shape[:1]:
        advantages = advantages.unsqueeze(-1).expand(shape)
    elif advantages.shape != shape:
        raise ValueError(f'advantages must have shape ({shape[0]},) or {tuple(shape)}, '
                         f'got {tuple(advantages.shape)}')
    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    valid = mask.bool()
    zero = torch.zeros((), dtype=dtype, device=logprobs.device)
    lp = torch.where(valid, logprobs.to(dtype), zero)
    old = torch.where(valid, old_logprobs.detach().to(dtype), zero)
    adv = torch.where(valid, advantages.detach().to(dtype), zero)
    log_ratio = (lp - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return PolicyInputs(lp, old, log_ratio, torch.exp(log_ratio), adv, valid)


def ratio_metrics(inp: PolicyInputs, loss: Tensor) -> dict[str, Tensor]:
    """Metrics common to every policy loss (detached 0-dim tensors).

    ``loss/pg`` (the aggregated loss), ``ratio/mean|max|min`` over valid tokens
    (0 for an empty mask) and ``loss/approx_kl``: the valid-token mean of the k3
    estimator ``(rho - 1) - log rho`` of KL(old || current).
    """
    with torch.no_grad():
        ratio, valid = inp.ratio, inp.mask
        zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
        any_valid = valid.any()
        r_max = r_min = zero
        if ratio.numel() > 0:  # amax/amin raise on a (0, T) or (N, 0) batch
            r_max = torch.where(valid, ratio, torch.full_like(ratio, -math.inf)).amax()
            r_min = torch.where(valid, ratio, torch.full_like(ratio, math.inf)).amin()
        k3 = (ratio - 1) - inp.log_ratio
        return {
            'loss/pg': loss.detach(),
            'ratio/mean': masked_mean(ratio, valid),
            'ratio/max': torch.where(any_valid, r_max, zero),
            'ratio/min': torch.where(any_valid, r_min, zero),
            'loss/approx_kl': masked_mean(k3, valid),
        }


def flag_fractions(inp: PolicyInputs, **flags: Tensor) -> dict[str, Tensor]:
    """``{'loss/<name>': share of valid tokens where flag is set}`` (detached 0-dim tensors)."""
    dtype = inp.ratio.dtype
    return {f'loss/{name}': masked_mean(flag.to(dtype), inp.mask).detach()
            for name, flag in flags.items()}
