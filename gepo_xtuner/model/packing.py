"""Padding-free trainer passes: several sequences in one row, attention never crossing them.

A micro-batch arrives as the padded block ``[left-padded prompt | right-padded
response]`` (``(B, L)``). :func:`pack_rows` keeps only its real tokens, sequence
after sequence, in one row of ``T = sum_i l_i`` tokens: positions restart at every
sequence (they are the padded block's own positions, gathered, so multimodal
rotary positions carry over too), and ``cu_seqlens = [0, l_0, l_0 + l_1, ...]``
marks the boundaries.

The model then runs with the attention implementation :data:`PACKED_ATTENTION`,
registered in ``transformers``' attention-function table. It attends within each
sequence only when the call is packed (flash-attention's varlen kernel on CUDA
where ``flash_attn`` is installed, else one causal SDPA call per sequence) and
otherwise hands over to the model's original implementation (``sdpa``, ``eager``,
...), so padded calls, generation included, are unchanged. The packing travels
in the ``attention_mask`` argument as a :class:`PackedSequences` descriptor (a
4-D ``int32`` tensor holding ``cu_seqlens``): it reaches every attention layer
on every path the mask does, gradient-checkpointing recomputation included, and
no real mask is ever ``int32``.

Cost: every linear layer sees ``T`` tokens instead of ``B * L`` and attention
costs ``sum_i l_i^2`` instead of ``B * L^2``; nothing is spent on padding.
"""

import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ['PACKED_ATTENTION', 'PackedRows', 'pack_rows', 'packed_sequences', 'cu_seqlens_of',
           'packed_attention', 'use_packed_attention', 'restore_attention',
           'inner_attention_name']

PACKED_ATTENTION = 'gepo_packed'
"""Prefix of the packing-aware attention implementations in ``transformers``' table:
``'gepo_packed:sdpa'`` wraps ``'sdpa'`` and so on (the name carries the wrapped one, so
nothing is added to the model's config)."""


@dataclass
class PackedRows:
    """The real tokens of a padded ``(B, L)`` block, packed into one row.

    Attributes:
        input_ids: ``(1, T)`` long, the rows' real tokens in row order, ``T = sum_i l_i``.
        position_ids: ``(1, T)`` long, or ``(3, 1, T)`` for multimodal rotary positions.
        cu_seqlens: ``(B + 1,)`` int32, ``cu_seqlens[i]`` is where row i starts.
        max_length: the longest row, ``max_i l_i``.
        index: ``(B, R)`` long, the packed position whose logits predict response token
            ``t`` of row ``i`` (``cu_seqlens[i] + p_i - 1 + t``; clamped for padding).
        labels: ``(1, T)`` long, the predicted response token at those positions and
            ``-100`` elsewhere (``gather_logprobs``' ignore index).
    """

    input_ids: Tensor
    position_ids: Tensor
    cu_seqlens: Tensor
    max_length: int
    index: Tensor
    labels: Tensor


def pack_rows(input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
              response_mask: Tensor) -> PackedRows | None:
    """Packs a ``[left-padded prompt | right-padded response]`` block into one row.

    Args:
        input_ids: ``(B, L)`` long.
        attention_mask: ``(B, L)``, 1 at real tokens (contiguous in every row).
        position_ids: ``(B, L)`` or ``(3, B, L)``, the positions the padded block would use.
        response_mask: ``(B, R)`` bool, the response tokens to score (a subset of the
            real ones in the last R columns).

    Returns:
        The :class:`PackedRows`, or None when a row with a response has no prompt
        token (nothing would predict its first response token).
    """
    keep = attention_mask.bool()
    lengths = keep.sum(1)
    width = response_mask.shape[1]
    # the prompt is what precedes the last R columns (response tokens the mask leaves out
    # may still be attended, e.g. a micro-batch whose losses are all masked)
    prompt_len = keep[:, :keep.shape[1] - width].sum(1)
    if bool(((prompt_len < 1) & response_mask.any(1)).any()):
        return None
    cu = F.pad(lengths.cumsum(0), (1, 0))
    ids = input_ids[keep][None]
    pos = position_ids[..., keep]
    pos = pos[None] if pos.dim() == 1 else pos[:, None]
    first = cu[:-1] + prompt_len - 1  # predicts response token 0
    index = (first[:, None] + torch.arange(width, device=cu.device)).clamp(0, max(int(cu[-1]) - 1, 0))
    labels = torch.full_like(ids, -100)
    if bool(response_mask.any()):
        labels[0, index[response_mask]] = input_ids[:, -width:][response_mask]
    return PackedRows(ids, pos, cu.to(torch.int32), int(lengths.max()), index, labels)


def packed_sequences(cu_seqlens: Tensor) -> Tensor:
    """The ``attention_mask`` argument of a packed call: ``cu_seqlens`` as ``(1, 1, 1, B + 1)``
    ``int32`` (read back by :func:`cu_seqlens_of`)."""
    return cu_seqlens.to(torch.int32).view(1, 1, 1, -1)


def cu_seqlens_of(attention_mask: Any) -> Tensor | None:
    """The ``cu_seqlens`` of a packed call's mask, or None for an ordinary mask."""
    if isinstance(attention_mask, Tensor) and attention_mask.dtype == torch.int32 \
            and attention_mask.dim() == 4 and attention_mask.shape[:3] == (1, 1, 1):
        return attention_mask.view(-1)
    return None


def _inner_attention(module: torch.nn.Module) -> Any:
    """The attention function the model had before packing was enabled."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    name = inner_attention_name(module.config._attn_implementation)
    if name == 'eager':  # each modeling file defines its own
        fn = getattr(sys.modules[type(module).__module__], 'eager_attention_forward', None)
        if fn is None:
            raise RuntimeError(f'{type(module).__name__} has no eager_attention_forward')
        return fn
    return ALL_ATTENTION_FUNCTIONS[name]


def _flash_varlen() -> Any:
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def packed_attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                     attention_mask: Tensor | None, dropout: float = 0.0,
                     scaling: float | None = None, sliding_window: int | None = None,
                     **kwargs: Any) -> tuple[Tensor, None]:
    """Causal attention within each packed sequence; the model's own attention otherwise.

    ``softmax(q_t k_s^T * scaling) v_s`` over the positions ``s <= t`` of the SAME
    sequence, for every sequence of the packed row.

    Args:
        module: the calling attention layer (its config names the wrapped implementation).
        query: ``(1, H, T, D)``; key, value: ``(1, H_kv, T, D)`` (grouped-query heads
            are repeated).
        attention_mask: a :func:`packed_sequences` descriptor, or an ordinary mask
            (then everything goes to the wrapped implementation).
        dropout: attention-probability dropout.
        scaling: softmax scale, default ``D ** -0.5``.
        sliding_window: refused if shorter than the longest sequence.

    Returns:
        ``((1, T, H, D), None)``, the layout of ``transformers``' attention functions.
    """
    cu = cu_seqlens_of(attention_mask)
    if cu is None:
        if isinstance(attention_mask, Tensor) and attention_mask.is_floating_point() \
                and query.is_cuda and inner_attention_name(
                    module.config._attn_implementation) == 'sdpa':
            # what transformers does for 'sdpa' itself: SDPA's memory-efficient kernel
            # returns NaN for fully masked (left-padding) query rows
            from transformers.modeling_attn_mask_utils import AttentionMaskConverter
            attention_mask = AttentionMaskConverter._unmask_unattended(
                attention_mask, torch.finfo(attention_mask.dtype).min)
        return _inner_attention(module)(module, query, key, value, attention_mask,
                                        dropout=dropout, scaling=scaling,
                                        sliding_window=sliding_window, **kwargs)
    bounds = cu.tolist()
    longest = max(b - a for a, b in zip(bounds[:-1], bounds[1:]))
    if sliding_window is not None and longest > sliding_window:
        raise ValueError(f'packed attention has no sliding window ({sliding_window} < a '
                         f'sequence of {longest}); set RLPolicy packing="off"')
    heads, kv_heads = query.shape[1], key.shape[1]
    varlen = _flash_varlen() if query.is_cuda and query.dtype in (torch.float16,
                                                                   torch.bfloat16) else None
    if varlen is not None:  # (T, H, D) layout, GQA handled by the kernel
        out = varlen(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                     cu, cu, longest, longest, dropout_p=dropout, softmax_scale=scaling,
                     causal=True)
        return out[None], None
    if kv_heads != heads:
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    # One split per tensor, not one slice per sequence: the backward of a slice writes a
    # gradient of the whole row (a zero fill and an addition of T positions), so slicing
    # S sequences cost S full-row passes in every layer's backward; a split's backward
    # is one concatenation. The attention inputs and outputs are the same views.
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    span = slice(bounds[0], bounds[-1])
    parts = [F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling,
                                            is_causal=True)
             for q, k, v, n in zip(*(t[:, :, span].split(lengths, dim=2)
                                     for t in (query, key, value)), lengths) if n > 0]
    out = torch.cat(parts, dim=2) if parts else query.new_zeros(query.shape)
    return out.transpose(1, 2), None


def inner_attention_name(name: str | None) -> str:
    """The wrapped implementation of a packed one (``'gepo_packed:sdpa'`` -> ``'sdpa'``);
    any other name unchanged (None -> ``'eager'``)."""
    name = name or 'eager'
    return name.split(':', 1)[1] if name.startswith(PACKED_ATTENTION + ':') else name


def _register(name: str, inner: str) -> None:
    from transformers import modeling_utils
    table = modeling_utils.ALL_ATTENTION_FUNCTIONS
    if not hasattr(table, 'register'):  # transformers < 4.50: a plain dict
        table[name] = packed_attention
        return
    table.register(name, packed_attention)  # AttentionInterface
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS as masks
    except ImportError:
        return
    if inner in masks:  # padded calls get the wrapped implementation's mask
        masks.register(name, masks[inner])


def _text_configs(model: torch.nn.Module) -> list[Any]:
    config = model.config
    return [config] + [getattr(config, k) for k in ('text_config', 'language_config')
                       if getattr(config, k, None) is not None]


def use_packed_attention(model: torch.nn.Module) -> str:
    """Switches ``model``'s language model to the packing-aware attention.

    Its former implementation keeps serving every unpacked call.

    Returns:
        The new implementation's name, ``'gepo_packed:<former>'``.
    """
    inner = inner_attention_name(model.config._attn_implementation)
    name = f'{PACKED_ATTENTION}:{inner}'
    _register(name, inner)
    for cfg in _text_configs(model):
        cfg._attn_implementation = name
    return name


def restore_attention(model: torch.nn.Module) -> None:
    """Undoes :func:`use_packed_attention`."""
    for cfg in _text_configs(model):
        cfg._attn_implementation = inner_attention_name(cfg._attn_implementation)
