"""A policy for inference, from a Hugging Face directory or an RL checkpoint (``iter_N.pth``)."""

import importlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from mmengine.config import Config

PREFIX = 'llm.'  # RLPolicy keeps the Hugging Face model as ``self.llm``


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Loads a runner checkpoint on CPU.

    mmengine checkpoints pickle more than tensors (the message hub's history), so
    this is a full pickle load, which can run code: load only checkpoints you trust.
    """
    ckpt = torch.load(path, map_location='cpu', weights_only=False)
    if not isinstance(ckpt, dict):
        raise ValueError(f'{path} is not an mmengine checkpoint (a dict with "state_dict"), '
                         f'it holds a {type(ckpt).__name__}')
    return ckpt


def checkpoint_config(ckpt: dict[str, Any]) -> Config | None:
    """The training config saved in the checkpoint's ``meta['cfg']``, if any.

    The config's ``custom_imports`` are imported when possible; one that fails is
    skipped with a warning (its registered names then stay unknown).
    """
    text = (ckpt.get('meta') or {}).get('cfg')
    if not isinstance(text, str) or not text.strip():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / 'train_cfg.py'
        file.write_text(text, encoding='utf-8')
        cfg = Config.fromfile(str(file), import_custom_modules=False)
    for module in (cfg.get('custom_imports') or {}).get('imports', []):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            print(f"warning: the checkpoint's config imports {module!r}, which fails here "
                  f'({exc}); its registered names are unavailable')
    return cfg


def policy_state_dict(ckpt: dict[str, Any], where: str = 'checkpoint') -> dict[str, torch.Tensor]:
    """The Hugging Face model's weights: ``state_dict`` entries under ``llm.``, unprefixed."""
    state = ckpt.get('state_dict')
    if not isinstance(state, dict):
        raise ValueError(f'{where} has no "state_dict"; expected a checkpoint saved by the RL '
                         'runner (iter_N.pth)')
    weights = {k[len(PREFIX):]: v for k, v in state.items() if k.startswith(PREFIX)}
    if not weights:
        raise ValueError(f'{where}: no "{PREFIX}*" weights in its state_dict (first keys: '
                         f'{list(state)[:3]}); expected a checkpoint of RLPolicy')
    return weights


@dataclass
class InferencePolicy:
    """What generation needs: the model (None when a server generates), tokenizer,
    processor (vision-language models), the checkpoint's training config, and the
    Hugging Face directory the architecture came from."""

    model: torch.nn.Module | None
    tokenizer: Any
    processor: Any = None
    config: Config | None = None
    directory: str | None = None


def load_for_inference(model: str, *, base_model: str | None = None,
                       tokenizer: str | None = None, processor: str | None = None,
                       model_class: str | None = None, trust_remote_code: bool | None = None,
                       torch_dtype: torch.dtype | None = torch.float32, load_model: bool = True
                       ) -> InferencePolicy:
    """Builds a policy for generation as :class:`~gepo_xtuner.model.RLPolicy` builds it.

    ``model`` is a Hugging Face directory, or an ``iter_N.pth`` written by the RL runner:
    then the architecture, tokenizer and processor come from ``base_model`` or, by
    default, from the ``model`` section of the config saved in the checkpoint
    (``pretrained``, ``tokenizer``, ``processor``, ``model_class``,
    ``trust_remote_code``; paths relative to the current directory, as in training),
    and the weights from the checkpoint. Arguments given here override the config.

    Args:
        model: model directory or ``.pth`` checkpoint.
        base_model: architecture/tokenizer directory for a checkpoint.
        tokenizer: tokenizer directory; default: the processor's tokenizer, else the
            model's directory.
        processor: ``AutoProcessor`` directory; default: the model's directory when
            ``model_class`` is not ``'AutoModelForCausalLM'``, else none.
        model_class: ``from_pretrained`` class (default ``'AutoModelForCausalLM'``).
        trust_remote_code: allow code shipped with the model.
        torch_dtype: parameter dtype; None: the dtype of a checkpoint's weights (the
            dtype the policy was trained in), else the directory's ``torch_dtype``.
        load_model: False loads tokenizer and processor only (a server generates).

    Raises:
        ValueError: not an RL checkpoint, no base model known, or weights that do
            not fit the architecture.
    """
    from transformers import AutoTokenizer

    from .policy import TEXT_MODEL_CLASS, load_processor, resolve_model_class

    ckpt, cfg, saved = None, None, {}
    directory = model
    if str(model).endswith('.pth'):
        ckpt = read_checkpoint(model)
        cfg = checkpoint_config(ckpt)
        saved = dict((cfg or {}).get('model') or {})
        directory = base_model or saved.get('pretrained')
        if not directory:
            raise ValueError(f'{model} carries no training config naming model.pretrained; '
                             'pass the base model directory (--base-model DIR)')
        local = directory.startswith(('.', '/')) or os.sep in directory  # not a hub id
        if local and not Path(directory).exists():
            raise ValueError(f'{model} was trained from model.pretrained={directory!r}, which '
                             'does not exist here; pass the base model directory '
                             '(--base-model DIR)')
    if base_model is not None:  # the saved paths belong to the saved base model
        saved = {k: v for k, v in saved.items() if k not in ('tokenizer', 'processor')}
    model_class = model_class or saved.get('model_class') or TEXT_MODEL_CLASS
    remote = {'trust_remote_code': bool(trust_remote_code if trust_remote_code is not None
                                        else saved.get('trust_remote_code', False))}
    processor = processor or saved.get('processor') or (
        directory if model_class != TEXT_MODEL_CLASS else None)
    proc = None if processor is None else load_processor(processor, remote)
    tokenizer = tokenizer or saved.get('tokenizer')
    if tokenizer is None and proc is not None:
        tok = proc.tokenizer
    else:
        tok = AutoTokenizer.from_pretrained(tokenizer or directory, **remote)
    if not load_model:
        return InferencePolicy(None, tok, proc, cfg, directory)
    weights = None if ckpt is None else policy_state_dict(ckpt, str(model))
    if torch_dtype is None and weights is not None:
        torch_dtype = next((v.dtype for v in weights.values() if v.is_floating_point()), None)
    net = resolve_model_class(model_class).from_pretrained(
        directory, torch_dtype='auto' if torch_dtype is None else torch_dtype, **remote)
    if weights is not None:
        try:
            net.load_state_dict(weights, strict=True)
        except RuntimeError as exc:
            raise ValueError(f'the weights in {model} do not fit {directory}: {exc}') from None
    return InferencePolicy(net.eval(), tok, proc, cfg, directory)
