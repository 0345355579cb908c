"""Per-prompt multimodal tensors (``pixel_values``, ``image_grid_thw``, ...) and their batching.

A vision-language processor turns one prompt with images into ``input_ids`` (image
placeholders expanded to one token per image feature) plus tensors whose first
dimension counts that prompt's image units, e.g.

* Qwen2-VL: ``pixel_values`` ``(sum_i t_i * h_i * w_i, C * T * P * P)``, the patches of
  all its images in order, and ``image_grid_thw`` ``(num_images, 3)``;
* InternVL-style: ``pixel_values`` ``(num_tiles, 3, H, W)``;
* LLaVA: ``pixel_values`` ``(num_images, 3, H, W)``.

A batch of rows is these tensors concatenated along dim 0 in row order, which is what
the processor itself returns for a batch: the model then fills the image tokens
row-major with the image features in the same order. Keeping the tensors per prompt
and concatenating the rows' own makes any row selection (minibatch, micro-batch)
carry exactly its images.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ['MMInputs', 'can_concat', 'collapse_placeholder_runs', 'concat_mm_inputs', 'mm_to',
           'placeholder_token_ids']

MMInputs = dict[str, Tensor]
"""One prompt's multimodal tensors, keyed as the model's ``forward`` names them."""


def can_concat(items: Sequence[Mapping[str, Tensor]]) -> bool:
    """Whether every key's tensors agree in all dims but the first (so they concatenate)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        for key, value in item.items():
            if shapes.setdefault(key, tuple(value.shape[1:])) != tuple(value.shape[1:]):
                return False
    return True


def concat_mm_inputs(items: Sequence[Mapping[str, Tensor]]) -> MMInputs:
    """The multimodal inputs of a batch whose rows have ``items`` (row order kept).

    Rows without a key (e.g. text-only prompts) add nothing to it; an empty result
    means a text-only batch.

    Raises:
        ValueError: a key's tensors differ beyond dim 0 (a processor that pads per
            batch): such models need one prompt per forward.
    """
    keys = list(dict.fromkeys(k for item in items for k in item))
    out: MMInputs = {}
    for key in keys:
        parts = [item[key] for item in items if key in item]
        if len({tuple(p.shape[1:]) for p in parts}) > 1:
            raise ValueError(
                f'multimodal input {key!r} has per-prompt shapes '
                f'{sorted({tuple(p.shape) for p in parts})} that do not concatenate along dim 0; '
                'this processor pads images per batch, so use one response per forward: '
                'train_cfg.max_tokens_per_micro_batch=1 and '
                'train_cfg.logprob_max_tokens_per_micro_batch=1')
        out[key] = parts[0] if len(parts) == 1 else torch.cat(parts)
    return out


def mm_to(inputs: Mapping[str, Tensor], device: torch.device | str,
          dtype: torch.dtype | None = None) -> MMInputs:
    """Moves the tensors to ``device``; floating-point ones (pixels) also to ``dtype``.

    Integer tensors (grid sizes, image sizes) keep their dtype.
    """
    return {k: v.to(device, dtype=dtype) if dtype is not None and v.is_floating_point()
            else v.to(device) for k, v in inputs.items()}


# Config fields (transformers' names across model families) of tokens that mark image or
# video slots: the model replaces them with vision features wherever they appear.
PLACEHOLDER_FIELDS = ('image_token_id', 'video_token_id', 'vision_start_token_id',
                      'image_token_index', 'video_token_index')


def placeholder_token_ids(config: Any) -> tuple[int, ...]:
    """Ids of a model's image / video placeholder tokens (``()`` for text-only models).

    A response must not contain them: scored with the prompt's images, the model
    would take a generated placeholder for an image slot (Qwen2-VL then fails with
    "Image features and image tokens do not match").
    """
    found = (getattr(config, name, None) for name in PLACEHOLDER_FIELDS)
    return tuple(sorted({v for v in found if isinstance(v, int) and v >= 0}))


def collapse_placeholder_runs(ids: Sequence[int], token_id: int,
                              num_images: int | None = None) -> list[int]:
    """``ids`` with each run of ``token_id`` cut to one token.

    The processor's expanded prompt holds one image token per image feature; an engine
    that expands each image placeholder itself (LMDeploy's ``/generate``: one
    ``token_id`` per image, repeated to the image's feature count) must get it back with
    one per image and everything else kept: for InternVL / Intern-S1 the ``<img>`` and
    ``</img>`` the processor writes around each run stay in place, so the engine's
    expansion is token for token the trainer's context.

    Args:
        ids: the expanded prompt, ``(L,)``.
        token_id: the image placeholder id (``processor.image_token_id``).
        num_images: when given, the number of runs it must contain.

    Returns:
        The collapsed ids, ``(L - sum_i (n_i - 1),)`` for runs of lengths ``n_i``.

    Raises:
        ValueError: the run count differs from ``num_images`` (two images whose runs
            touch cannot be told apart, or the prompt lost a placeholder).
    """
    out: list[int] = []
    runs = 0
    for t in ids:
        t = int(t)
        if t == token_id and out and out[-1] == token_id:
            continue
        runs += t == token_id
        out.append(t)
    if num_images is not None and runs != num_images:
        raise ValueError(f'the prompt has {runs} runs of image token {token_id} for {num_images} '
                         'images; the engine would give the images to the wrong slots (adjacent '
                         'images need a separator between their runs, as the chat templates write)')
    return out
