"""Hugging Face model directories from a trained policy: weights, tokenizer, processor.

What a run trains (``RLPolicy.llm``, saved in ``iter_N.pth`` under ``llm.*``) leaves it
as a directory that ``from_pretrained`` loads and servers (LMDeploy, vLLM, TGI) serve:
``config.json`` and ``generation_config.json``, ``model.safetensors`` in the model's
dtype, the tokenizer with its chat template and, for vision-language models, the
processor (``preprocessor_config.json``, ``chat_template.json``).

A directory is written next to its destination under a temporary name and renamed
into place, so an interrupted export never leaves a half-written model where a server
would load it; an older export at the destination is replaced only once the new one
is complete.
"""

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from .checkpoint import load_for_inference


def save_hf_directory(model: torch.nn.Module, tokenizer: Any, out: str | os.PathLike,
                      processor: Any = None) -> Path:
    """Writes ``model`` (+ tokenizer, processor) to ``out`` atomically; returns ``out``.

    Args:
        model: a ``transformers`` model (``PreTrainedModel``); saved in its own dtype
            as safetensors, with its config and generation config.
        tokenizer: the tokenizer the model was trained with (chat template included).
        out: destination directory; replaced if it exists.
        processor: the ``AutoProcessor`` of a vision-language model (it saves its own
            tokenizer, image processor and chat template), or None.
    """
    if getattr(next(model.parameters(), None), 'ds_numel', None) is not None:
        raise ValueError('the model parameters are partitioned (DeepSpeed ZeRO-3): save a '
                         'checkpoint and export it with tools/export_hf.py, or train with '
                         'ZeRO-2 to export during training')
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f'.{out.name}.tmp-', dir=out.parent))
    try:
        config = model.config
        attn = [(c, c._attn_implementation) for c in _configs(config)]
        for c, name in attn:  # a packed-attention alias of training is not a saved setting
            c._attn_implementation = name.split(':')[-1] if name else name
        try:
            model.save_pretrained(tmp, safe_serialization=True)
        finally:
            for c, name in attn:
                c._attn_implementation = name
        tokenizer.save_pretrained(tmp)
        if processor is not None:
            processor.save_pretrained(tmp)
        old = None
        if out.exists():
            old = out.parent / f'.{out.name}.old-{os.getpid()}'
            out.rename(old)
        tmp.rename(out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _configs(config: Any) -> list[Any]:
    """The config and its sub-configs (``text_config``, ``vision_config``) that exist."""
    subs = [getattr(config, name, None) for name in ('text_config', 'vision_config')]
    return [config, *(c for c in subs if c is not None and hasattr(c, '_attn_implementation'))]


def export_checkpoint(checkpoint: str | os.PathLike, out: str | os.PathLike, *,
                      base_model: str | None = None, torch_dtype: str | None = None,
                      trust_remote_code: bool | None = None) -> Path:
    """Exports an RL checkpoint (``iter_N.pth``) as a Hugging Face directory.

    The architecture, tokenizer and processor come from the ``model`` section of the
    training config saved in the checkpoint (or ``base_model``), the weights from the
    checkpoint; the tokenizer gets the pad token training gave it (``model.pad_token``,
    else its EOS when it has none).

    Args:
        checkpoint: ``iter_N.pth`` written by the RL runner.
        out: destination directory (replaced if it exists).
        base_model: architecture / tokenizer directory, when the saved config's
            ``model.pretrained`` does not exist here.
        torch_dtype: dtype of the saved weights, e.g. ``'bfloat16'``; default: the
            dtype the policy was trained in (the checkpoint's weights).
        trust_remote_code: allow code shipped with the base model.

    Raises:
        ValueError: not an RL checkpoint, no base model, weights that do not fit it, or
            an unknown dtype.
    """
    from .policy import set_pad_token

    dtype = None
    if torch_dtype is not None:
        dtype = getattr(torch, torch_dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {torch_dtype!r}; use e.g. 'float32' or 'bfloat16'")
    policy = load_for_inference(str(checkpoint), base_model=base_model, torch_dtype=dtype,
                                trust_remote_code=trust_remote_code)
    saved = dict((policy.config or {}).get('model') or {})
    set_pad_token(policy.tokenizer, saved.get('pad_token'))
    return save_hf_directory(policy.model, policy.tokenizer, out, processor=policy.processor)
