"""One float per set of weights, shared by the overlap tests and their recording backend
(a module of its own: importing ``plugins`` would register the test plugins in-process)."""

import torch


def weights_fingerprint(state: dict[str, torch.Tensor]) -> float:
    """The sum of every tensor in float64, in name order (two versions of the tiny policy
    never share it; the same weights always give it)."""
    return float(sum(state[name].detach().double().sum() for name in sorted(state)))
