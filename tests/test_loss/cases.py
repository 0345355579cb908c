"""Random small loss inputs as plain Python lists, shared by the loss reference tests."""

import math
import random

import torch


def random_case(seed: int, *, old_shift: tuple[float, float] = (-0.7, 0.7), adv_scale: float = 1.0):
    """Python lists: logprobs, old_logprobs, advantages ((N,) or (N, T)), mask.

    One row is fully masked when N > 1; odd seeds give per-response advantages,
    even seeds per-token ones. ``old_shift`` bounds ``logp_old - logp``.
    """
    rng = random.Random(seed)
    n, t = rng.randint(1, 5), rng.randint(1, 7)
    lp = [[rng.uniform(-3.0, -0.05) for _ in range(t)] for _ in range(n)]
    old = [[x + rng.uniform(*old_shift) for x in row] for row in lp]
    mask = [[rng.random() < 0.75 for _ in range(t)] for _ in range(n)]
    if n > 1:
        mask[rng.randrange(n)] = [False] * t
    if seed % 2:
        adv = [rng.gauss(0.0, adv_scale) for _ in range(n)]
    else:
        adv = [[rng.gauss(0.0, adv_scale) for _ in range(t)] for _ in range(n)]
    return lp, old, adv, mask


def token_adv(adv, i, t):
    return adv[i] if not isinstance(adv[i], list) else adv[i][t]


def agg_weights(mask, agg):
    """d loss / d per-token loss for the two aggregation modes (plain Python)."""
    n_tok = sum(map(sum, mask))
    n_seq = sum(1 for row in mask if any(row))
    out = []
    for row in mask:
        count = sum(row)
        if agg == 'token-mean':
            out.append([1.0 / n_tok if m else 0.0 for m in row])
        else:
            out.append([1.0 / (count * n_seq) if m else 0.0 for m in row])
    return out


def to_tensors(lp, old, adv, mask):
    """float64 tensors; log-probs are NaN at padding, which must not leak."""
    mask_t = torch.tensor(mask)
    old_t = torch.tensor(old, dtype=torch.float64).masked_fill(~mask_t, math.nan)
    lp_t = torch.tensor(lp, dtype=torch.float64).masked_fill(~mask_t, math.nan)
    lp_t.requires_grad_()
    return lp_t, old_t, torch.tensor(adv, dtype=torch.float64), mask_t
