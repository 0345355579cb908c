"""Data-parallel reductions that degrade to no-ops in a single process."""

import torch
import torch.distributed as dist


def dist_world_size() -> int:
    """Number of data-parallel processes; 1 when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sums ``tensor`` over all ranks, in place, and returns it.

    A single process (or an uninitialised process group) returns the tensor
    unchanged, so callers never branch on the launch mode. Every rank receives
    the same reduced values, which is what keeps batch statistics and the state
    derived from them identical across ranks.

    Args:
        tensor: Any shape. It must live on a device the backend supports (CPU for
            gloo, CUDA for nccl); float64 is recommended for sums of statistics.

    Returns:
        The same tensor object, now holding the global sum.
    """
    if dist_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


