"""Token-level log-probabilities and entropies with chunk-bounded memory.

Policy-gradient losses need ``log pi(y_t | y_<t)`` of sampled tokens and often
the policy entropy. With ``B*T ~ 1e4`` and ``V ~ 1e5`` the logits alone are
gigabytes, and the textbook ``log_softmax(logits).gather(...)`` writes another
full-size tensor (and more for its gradient).

The functions below work on ``chunk_size`` rows (token positions) at a time,
upcasting each chunk to float32 (float64 stays float64); strided inputs such as
``logits[:, :-1]`` are not copied. Forward and backward are custom
:class:`torch.autograd.Function` s: autograd saves only the *input* logits (a
reference, not a copy) plus ``O(B*T)`` per-row statistics (``logsumexp``, and the
entropy), and the backward recomputes the softmax chunk by chunk. Extra memory is
therefore ``O(chunk_size * V)`` in forward and backward, apart from the gradient
itself (shape and dtype of ``logits``). Double backward is not supported.
"""

import math

import torch
from torch import Tensor

__all__ = ['gather_logprobs', 'token_nll', 'token_entropy', 'masked_sampled_entropy',
           'auto_chunk_size']


CHUNK_ELEMENTS = {'cpu': 1 << 22, 'default': 1 << 26}
"""Automatic chunk budget in logits elements: 16 MiB of float32 per chunk on CPU
(cache- and page-fault-friendly, measured faster than larger chunks by
``benchmarks/bench_token_ops.py``), 256 MiB on accelerators (few kernel launches)."""


def auto_chunk_size(logits: Tensor) -> int:
    """Rows per chunk for ``chunk_size=None``: the device's budget divided by V."""
    budget = CHUNK_ELEMENTS.get(logits.device.type, CHUNK_ELEMENTS['default'])
    return max(1, budget // max(1, logits.shape[-1]))


def _check_logits(logits: Tensor, temperature: float, chunk_size: int) -> None:
    if not isinstance(logits, Tensor) or not logits.is_floating_point():
        raise ValueError(f'logits must be a floating-point tensor, got {type(logits).__name__} '
                         f'{getattr(logits, "dtype", "")}')
    if logits.dim() < 2 or logits.shape[-1] == 0:
        raise ValueError(f'logits must have shape (..., V) with V > 0, got {tuple(logits.shape)}')
    if isinstance(temperature, bool) or not (temperature > 0) or math.isinf(temperature):
        raise ValueError(f'temperature must be a finite number > 0, got {temperature!r}')
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f'chunk_size must be a positive int, got {chunk_size!r}')


def _scaled(chunk: Tensor, dtype: torch.dtype, temperature: float) -> Tensor:
    """``chunk / temperature`` in ``dtype``; may alias ``chunk`` (never written to)."""
    if temperature == 1.0:
        return chunk.to(dtype)
    return chunk.to(dtype, copy=True).div_(temperature)


def _as_3d(logits: Tensor) -> Tensor:
    """``(..., V) -> (B, T, V)`` view, ``B = 1`` if possible (no copy for ``x[:, :-1]``)."""
    try:
        return logits.view(1, -1, logits.shape[-1])
    except RuntimeError:
        return logits.flatten(0, -3) if logits.dim() > 3 else logits


def _chunks(x: Tensor, chunk_size: int):
    """Yields ``(b, slice)`` covering the ``(B, T)`` rows of ``x``, ``chunk_size`` at a time."""
    for b in range(x.shape[0]):
        for s in range(0, x.shape[1], chunk_size):
            yield b, slice(s, s + chunk_size)


def _shift(z: Tensor) -> Tensor:
    """Row ``logsumexp``, 0 for rows of only ``-inf`` (then ``p = 0``, ``H = 0``, no NaN)."""
    lse = torch.logsumexp(z, dim=-1)
    return lse.masked_fill_(lse == -math.inf, 0.0)


def _clamped_logp(z: Tensor, lse: Tensor, out: Tensor | None = None) -> Tensor:
    """``z - lse`` with ``-inf`` clamped to the lowest finite value.

    Masked vocab entries (``z = -inf``) then have ``p = 0`` and ``p * log p = 0``
    instead of ``0 * -inf = NaN``; NaN inputs still propagate.
    """
    logp = torch.sub(z, lse, out=out)
    return logp.clamp_(min=torch.finfo(logp.dtype).min)


class _GatherLogprobs(torch.autograd.Function):
    """``(B, T, V), (B, T) -> (B, T)``: ``z[label] - logsumexp(z)``, ``z = logits / temp``."""

    @staticmethod
    def forward(ctx, logits, labels, valid, temperature, chunk_size):
        dtype = torch.promote_types(logits.dtype, torch.float32)
        lse = torch.empty(logits.shape[:2], dtype=dtype, device=logits.device)
        for b, t in _chunks(logits, chunk_size):
            lse[b, t] = torch.logsumexp(_scaled(logits[b, t], dtype, temperature), dim=-1)
        picked = _scaled(logits.gather(2, labels[..., None]).squeeze(2), dtype, temperature)
        out = (picked - lse).masked_fill_(~valid, 0.0)
        ctx.save_for_backward(logits, labels, valid, lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out):
        # d out / d z_j = 1[j == label] - softmax(z)_j ;  dz/dlogits = 1 / temperature.
        logits, labels, valid, lse = ctx.saved_tensors
        g = (grad_out.to(lse.dtype) / ctx.temperature).masked_fill_(~valid, 0.0)[..., None]
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        for b, t in _chunks(logits, ctx.chunk_size):
            z = _scaled(logits[b, t], lse.dtype, ctx.temperature)
            buf = grad[b, t] if grad.dtype == lse.dtype else None  # in place when possible
            p = torch.sub(z, lse[b, t, None], out=buf).exp_()
            p.mul_(-g[b, t]).scatter_add_(1, labels[b, t, None], g[b, t])
            if buf is None:
                grad[b, t].copy_(p)
        return grad, None, None, None, None


class _TokenEntropy(torch.autograd.Function):
    """``(B, T, V) -> (B, T)``: ``H = -sum_j p_j log p_j``, ``p = softmax(logits / temp)``."""

    @staticmethod
    def forward(ctx, logits, temperature, chunk_size):
        dtype = torch.promote_types(logits.dtype, torch.float32)
        lse = torch.empty(logits.shape[:2], dtype=dtype, device=logits.device)
        ent = torch.empty_like(lse)
        for b, t in _chunks(logits, chunk_size):
            z = _scaled(logits[b, t], dtype, temperature)
            lse[b, t] = _shift(z)
            logp = _clamped_logp(z, lse[b, t, None])
            ent[b, t] = -logp.mul_(logp.exp()).sum(-1)
        ctx.save_for_backward(logits, lse, ent)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return ent

    @staticmethod
    def backward(ctx, grad_out):
        # dH/dz_j = -p_j (log p_j + H) ;  dz/dlogits = 1 / temperature.
        logits, lse, ent = ctx.saved_tensors
        g = (grad_out.to(lse.dtype) / ctx.temperature)[..., None]
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        for b, t in _chunks(logits, ctx.chunk_size):
            z = _scaled(logits[b, t], lse.dtype, ctx.temperature)
            buf = grad[b, t] if grad.dtype == lse.dtype else None
            logp = _clamped_logp(z, lse[b, t, None], out=buf)
            p = logp.exp()
            logp.add_(ent[b, t, None]).mul_(p).mul_(-g[b, t])
            if buf is None:
                grad[b, t].copy_(logp)
        return grad, None, None


def gather_logprobs(logits: Tensor,
                    labels: Tensor,
                    *,
                    temperature: float = 1.0,
                    chunk_size: int | None = None,
                    ignore_index: int | None = -100) -> Tensor:
    """Log-probability of each label token, chunked over rows.

    ``out[..., t] = log softmax(z)[label] = z[label] - logsumexp(z)`` with
    ``z = logits[..., t, :].float() / temperature``. No full-vocab ``log_softmax``
    copy is made: extra memory is ``O(chunk_size * V)`` in forward and backward
    (see the module docstring); the backward allocates only the gradient itself.

    Args:
        logits: ``(B, T, V)`` or ``(N, V)`` (any leading dims), any float dtype.
        labels: ``logits.shape[:-1]``, integer token ids in ``[0, V)``.
        temperature: sampling temperature ``> 0`` the logits are divided by.
        chunk_size: rows per chunk (``> 0``); None picks :func:`auto_chunk_size`.
        ignore_index: label value whose positions get logprob 0 (and zero
            gradient); ``None`` disables it.

    Returns:
        ``logits.shape[:-1]`` log-probabilities in float32 (float64 for float64
        logits).

    Raises:
        ValueError: on bad dtypes, mismatched shapes, ``temperature <= 0`` or
            ``chunk_size <= 0``.
    """
    if chunk_size is None and isinstance(logits, Tensor) and logits.dim() >= 1:
        chunk_size = auto_chunk_size(logits)
    _check_logits(logits, temperature, chunk_size)
    if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.is_complex() \
            or labels.dtype == torch.bool:
        raise ValueError(f'labels must be an integer tensor, got {getattr(labels, "dtype", labels)}')
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f'labels shape {tuple(labels.shape)} must equal logits shape without the '
                         f'vocab dim {tuple(logits.shape[:-1])}')
    x = _as_3d(logits)
    ids = labels.reshape(x.shape[:2]).long()
    if ignore_index is None:
        valid = torch.ones_like(ids, dtype=torch.bool)
    else:
        valid = ids != ignore_index
        ids = ids.masked_fill(~valid, 0)  # any in-range index
    out = _GatherLogprobs.apply(x, ids, valid, float(temperature), chunk_size)
    return out.reshape(labels.shape)


def token_nll(logits: Tensor, labels: Tensor, **kwargs) -> Tensor:
    """Per-token negative log-likelihood, ``-gather_logprobs(logits, labels, **kwargs)``.

    Takes the same keyword arguments as :func:`gather_logprobs`; ignored
    positions are 0.
    """
    return -gather_logprobs(logits, labels, **kwargs)


def token_entropy(logits: Tensor, *, temperature: float = 1.0,
                  chunk_size: int | None = None) -> Tensor:
    """Full-vocabulary entropy of every token distribution, chunked over rows.

    ``H = -sum_j p_j log p_j = logsumexp(z) - sum_j p_j z_j`` with
    ``p = softmax(z)``, ``z = logits.float() / temperature``, computed per chunk
    of ``chunk_size`` rows in float32 as ``-sum p * (z - logsumexp(z))``.
    Stable for very peaked rows (gives ~0) and for ``-inf`` (masked) entries,
    which contribute 0; a row of only ``-inf`` gets entropy 0.

    Differentiable when ``logits`` requires grad (backward recomputes per chunk,
    ``dH/dz_j = -p_j (log p_j + H)``). For logging metrics call it under
    ``torch.no_grad()`` so that nothing is saved for backward.

    Args:
        logits: ``(B, T, V)`` or ``(N, V)`` (any leading dims), any float dtype.
        temperature: ``> 0``, the logits are divided by it.
        chunk_size: rows per chunk (``> 0``); None picks :func:`auto_chunk_size`.

    Returns:
        ``logits.shape[:-1]`` entropies in nats, float32 (float64 for float64 logits).
    """
    if chunk_size is None and isinstance(logits, Tensor) and logits.dim() >= 1:
        chunk_size = auto_chunk_size(logits)
    _check_logits(logits, temperature, chunk_size)
    out = _TokenEntropy.apply(_as_3d(logits), float(temperature), chunk_size)
    return out.reshape(logits.shape[:-1])


def masked_sampled_entropy(logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-sequence Monte-Carlo entropy estimate from sampled-token logprobs.

    ``out[n] = sum_t mask[n, t] * (-logprobs[n, t]) / max(1, sum_t mask[n, t])``;
    since ``E_{y~p}[-log p(y)] = H(p)`` this estimates the mean token entropy when
    the tokens were sampled from the distribution that gave ``logprobs``. Rows
    without valid tokens give 0; masked values are never used (may be -inf/NaN).

    Args:
        logprobs: ``(N, T)`` float log-probabilities of the sampled tokens.
        mask: ``(N, T)`` bool or 0/1 tensor, nonzero = valid token.

    Returns:
        ``(N,)`` estimates, dtype of ``logprobs``.
    """
    if not isinstance(logprobs, Tensor) or not logprobs.is_floating_point() or logprobs.dim() != 2:
        raise ValueError(f'logprobs must be a 2-D float tensor (N, T), got '
                         f'{getattr(logprobs, "dtype", type(logprobs))} '
                         f'{tuple(getattr(logprobs, "shape", ()))}')
    if not isinstance(mask, Tensor) or mask.shape != logprobs.shape:
        raise ValueError(f'mask shape {tuple(getattr(mask, "shape", ()))} must equal logprobs '
                         f'shape {tuple(logprobs.shape)}')
    valid = mask.bool()
    total = torch.where(valid, -logprobs, torch.zeros_like(logprobs)).sum(-1)
    return total / valid.sum(-1).clamp_min(1).to(logprobs.dtype)
