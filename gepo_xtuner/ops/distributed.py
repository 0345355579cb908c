"""Data-parallel reductions that degrade to no-ops in a single process.

Every collective of the package goes through this module, so one function,
:func:`collective_device`, decides where its tensor must live: an NCCL process
group serves CUDA tensors only, gloo serves CPU tensors (and CUDA tensors by a
host copy), and a group created with a per-device backend string such as
``'cpu:gloo,cuda:nccl'`` serves each device with its own backend. Callers keep their
tensors wherever they are; :func:`all_reduce` moves a copy to the right device and
the result back.
"""

import contextlib
import contextvars
from collections.abc import Iterator

import torch
import torch.distributed as dist

__all__ = ['all_reduce', 'all_reduce_sum', 'backend_devices', 'collective_device',
           'dist_rank', 'dist_world_size', 'reduce_in_group', 'replicated_batch']

_REPLICATED = contextvars.ContextVar('gepo_xtuner_replicated_batch', default=False)


@contextlib.contextmanager
def replicated_batch() -> Iterator[None]:
    """Within the block, every rank holds the same, whole batch: :func:`all_reduce` is
    the identity, as in a single process.

    For trainers that gather the step's whole batch on every process before computing
    advantages (TRL's ``GRPOTrainer``): reducing batch statistics over ranks would count
    each group once per process. Every rank computes the same values from the same data.
    """
    token = _REPLICATED.set(True)
    try:
        yield
    finally:
        _REPLICATED.reset(token)


def dist_world_size() -> int:
    """Number of data-parallel processes; 1 when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def dist_rank() -> int:
    """This process's rank; 0 when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


def backend_devices(backend: str) -> dict[str, str]:
    """Device type -> backend name of a process-group backend string.

    Args:
        backend: what ``torch.distributed.get_backend()`` returns: a plain name
            (``'gloo'``, ``'nccl'``, ``'mpi'``, ...) or a per-device list
            (``'cpu:gloo,cuda:nccl'``).

    Returns:
        e.g. ``{'cpu': 'gloo', 'cuda': 'gloo'}`` for gloo, ``{'cuda': 'nccl'}`` for
        nccl, ``{'cpu': 'gloo', 'cuda': 'nccl'}`` for the mixed string.

    Example:
        >>> backend_devices('cpu:gloo,cuda:nccl')
        {'cpu': 'gloo', 'cuda': 'nccl'}
    """
    backend = backend.lower()
    if ':' in backend:
        pairs = (part.split(':', 1) for part in backend.split(','))
        return {device.strip(): name.strip() for device, name in pairs}
    if backend == 'nccl':
        return {'cuda': 'nccl'}
    if backend in ('hccl', 'cncl', 'mccl'):  # accelerator-only backends (Ascend, MLU, MACA)
        return {'npu' if backend == 'hccl' else 'mlu' if backend == 'cncl' else 'musa': backend}
    return {'cpu': backend, 'cuda': backend}  # gloo, mpi, ucc: host tensors are always fine


def collective_device(backend: str, tensor_device: torch.device | str,
                      accelerator: torch.device | str | None = None) -> torch.device:
    """The device a tensor must be on for a collective under ``backend``.

    The tensor's own device when the backend serves it (no copy); otherwise the
    first device type the backend serves: ``accelerator`` (default: the current
    CUDA device) for accelerator-only backends, else the CPU.

    Args:
        backend: the process group's backend string (see :func:`backend_devices`).
        tensor_device: where the tensor lives now.
        accelerator: the rank's accelerator device, used when the backend needs one.

    Raises:
        RuntimeError: the backend serves only an accelerator and none is given or
            available (an NCCL group in a process without CUDA).

    Example:
        >>> collective_device('nccl', 'cpu', accelerator='cuda:1')
        device(type='cuda', index=1)
        >>> collective_device('cpu:gloo,cuda:nccl', 'cuda:0')
        device(type='cuda', index=0)
    """
    tensor_device = torch.device(tensor_device)
    served = backend_devices(backend)
    if tensor_device.type in served:
        return tensor_device
    if 'cpu' in served:
        return torch.device('cpu')
    if accelerator is None:
        device_type = next(iter(served))
        if device_type == 'cuda' and torch.cuda.is_available():
            accelerator = torch.device('cuda', torch.cuda.current_device())
        else:
            raise RuntimeError(f'the {backend!r} process group needs {device_type} tensors but '
                               f'this process has no {device_type} device; launch with one '
                               'accelerator per rank or use a gloo process group')
    accelerator = torch.device(accelerator)
    if accelerator.type not in served:
        raise RuntimeError(f'the {backend!r} process group serves {sorted(served)} tensors, '
                           f'not {accelerator.type}')
    return accelerator


def all_reduce(tensor: torch.Tensor, op: str = 'sum') -> torch.Tensor:
    """Reduces ``tensor`` over all ranks and returns the result on its own device.

    A single process (or an uninitialised process group, or a :func:`replicated_batch`
    block) returns the tensor unchanged, so callers never branch on the launch mode. Every rank receives
    the same values, which is what keeps batch statistics and the state derived
    from them identical across ranks. The reduction runs on the device
    :func:`collective_device` picks for the default group's backend (a CPU tensor
    under NCCL is copied to this rank's GPU and back).

    Args:
        tensor: Any shape; float64 is recommended for sums of statistics.
        op: ``'sum'``, ``'max'`` or ``'min'``.

    Returns:
        ``tensor`` itself (reduced in place) when it was already on the right
        device, else a new tensor on ``tensor.device``.
    """
    if op not in _OPS:
        raise ValueError(f"op must be one of {sorted(_OPS)}, got {op!r}")
    if dist_world_size() <= 1 or _REPLICATED.get():
        return tensor
    return reduce_in_group(tensor, op)


_OPS = {'sum': dist.ReduceOp.SUM, 'max': dist.ReduceOp.MAX, 'min': dist.ReduceOp.MIN}


def reduce_in_group(tensor: torch.Tensor, op: str = 'sum') -> torch.Tensor:
    """The collective of :func:`all_reduce` in the default group, whatever its size.

    Runs on the device :func:`collective_device` picks for the group's backend and
    returns the result on ``tensor.device`` (``tensor`` itself when no copy was needed).
    :func:`all_reduce` skips it for a single process; the GPU checks call it in a
    one-rank NCCL group to run the real path.
    """
    device = collective_device(str(dist.get_backend()), tensor.device)
    if device == tensor.device:
        dist.all_reduce(tensor, op=_OPS[op])
        return tensor
    moved = tensor.to(device)
    dist.all_reduce(moved, op=_OPS[op])
    return moved.to(tensor.device)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sums ``tensor`` over all ranks (:func:`all_reduce` with ``op='sum'``)."""
    return all_reduce(tensor, 'sum')
