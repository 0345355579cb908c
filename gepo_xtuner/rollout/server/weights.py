"""The trainer's weights as an engine reads them: checkpoint names, buckets, and files.

Engine-independent: any server backend pushes weights either as tensors under the
names its loader reads from a checkpoint (:func:`named_weights`, in :func:`buckets`), or
as a checkpoint directory the server loads (:func:`save_weights`, under a directory
every server can read, by default one :class:`WeightDir` makes).
"""

import atexit
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

# Weight files that ``save_pretrained`` rewrites; other files of the base model are kept.
WEIGHT_SUFFIXES = ('.safetensors', '.bin', '.pt', '.pth', '.index.json')


def named_weights(model: nn.Module, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None
                  ) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every parameter, under Hugging Face checkpoint names.

    The names are those ``save_pretrained`` writes (:func:`checkpoint_items`), the
    names every engine's loader reads from disk: for a vision-language model on
    transformers >= 4.52 they differ from the module names (InternVL:
    ``model.language_model.X`` is ``language_model.model.X`` in the checkpoint,
    ``model.vision_tower.X`` is ``vision_tower.X``). LMDeploy 0.18's InternVL module
    maps either form (its ``rename_weight``); an engine that only knows the files'
    names needs these. On transformers 5 a model with weight converters (fused MoE
    experts) gets its tensors converted back here, as ``save_pretrained`` does, which
    builds new tensors on every push. Tied parameters appear once (under the first name, e.g. the
    embedding), as in a saved checkpoint. Tensors are detached, contiguous, optionally
    cast and moved.
    """
    for name, t in checkpoint_items(model):
        if dtype is not None or device is not None:
            t = t.to(dtype=dtype or t.dtype, device=device or t.device)
        yield name, t.contiguous()


def checkpoint_items(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The model's parameters (detached) under the names its ``save_pretrained`` writes.

    transformers 5 keeps the renaming it applied at load (or its default one for the
    class) and reverts it on save (``revert_weight_conversion``); 4.52 to 4.57 reverse
    ``_checkpoint_conversion_mapping`` on save; older versions save the module names.
    The same is done here, so weights pushed to a server arrive under the names the
    server's loader reads from the checkpoint on disk.
    """
    items = [(name, param.detach()) for name, param in model.named_parameters()]
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4
        revert_weight_conversion = None
    if revert_weight_conversion is not None and hasattr(model, 'config'):
        return list(revert_weight_conversion(model, dict(items)).items())
    mapping = getattr(model, '_checkpoint_conversion_mapping', None) or {}
    if not mapping:
        return items
    reverse = {replacement: pattern for pattern, replacement in mapping.items()}
    out = []
    for name, tensor in items:
        for pattern, replacement in reverse.items():
            replacement = re.sub(r'\(.*\)', '', replacement.lstrip('^'))
            name, hits = re.subn(pattern, replacement, name)
            if hits:
                break
        out.append((name, tensor))
    return out


def buckets(named: Iterator[tuple[str, torch.Tensor]], bucket_bytes: int
            ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Groups tensors into lists of at most ``bucket_bytes`` (a larger tensor goes alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket


def save_weights(model: nn.Module, tokenizer: Any, shared_dir: str | os.PathLike, step: int,
                 base_model: str | None = None, keep: int = 2) -> Path:
    """Writes a complete model directory to ``shared_dir/step_{step}`` atomically.

    The directory is written under a temporary name and renamed when complete, so a
    server never sees half a checkpoint. Non-weight files of ``base_model`` (a local
    directory: chat template, processor configs, ...) are copied first, then
    ``save_pretrained`` (safetensors) and the tokenizer overwrite theirs. Only the
    newest ``keep`` ``step_*`` directories are kept.

    Returns:
        The new directory.
    """
    if not hasattr(model, 'save_pretrained'):
        raise TypeError(f"weight_sync mode 'disk' saves with save_pretrained, which "
                        f'{type(model).__name__} lacks; pass the transformers model')
    root = Path(shared_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f'step_{step}'
    tmp = Path(tempfile.mkdtemp(prefix=f'.step_{step}.tmp-', dir=root))
    try:
        if base_model is not None and Path(base_model).is_dir():
            for f in Path(base_model).iterdir():
                if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES):
                    shutil.copy2(f, tmp / f.name)
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    old = sorted((p for p in root.glob('step_*') if p.is_dir() and p.name[5:].isdigit()),
                 key=lambda p: int(p.name[5:]))
    for p in old[:-keep] if keep > 0 else []:
        if p != final:
            shutil.rmtree(p, ignore_errors=True)
    return final


class WeightDir:
    """A new directory for weight files, made at the first :meth:`path` and removed at
    :meth:`remove` or exit.

    It is in ``/dev/shm`` (memory, fast to write and to load) when that has room for
    ``keep + 1`` copies of the model, else in the temporary directory (a container's
    ``/dev/shm`` is often 64 MiB). Only servers on the trainer's machine can read it;
    servers elsewhere need a ``shared_dir`` they all mount.

    Args:
        prefix: the directory name's prefix.
    """

    def __init__(self, prefix: str = 'gepo_weights_') -> None:
        self.prefix = prefix
        self._path: str | None = None

    def path(self, model: nn.Module, keep: int) -> str:
        """The directory (made now if it is not yet)."""
        if self._path is None:
            need = (keep + 1) * sum(p.numel() * p.element_size() for p in model.parameters())
            shm = '/dev/shm'
            where = shm if os.path.isdir(shm) and shutil.disk_usage(shm).free > need else None
            self._path = tempfile.mkdtemp(prefix=self.prefix, dir=where)
            atexit.register(shutil.rmtree, self._path, True)
        return self._path

    def remove(self) -> None:
        """Removes the directory and what it holds (nothing when it was never made)."""
        if self._path is not None:
            # the exit hook stays: removing a directory that is gone does nothing
            shutil.rmtree(self._path, ignore_errors=True)
            self._path = None
