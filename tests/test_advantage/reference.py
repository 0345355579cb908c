"""Plain-Python reference implementations (loops over groups, floats, ``math``).

Written independently of the vectorised code so that tests compare two
implementations of the formulas in the algorithm notes.
"""

import math
from collections import defaultdict


def groups_of(batch) -> dict[int, list[int]]:
    groups = defaultdict(list)
    for i, g in enumerate(batch.group_ids.tolist()):
        groups[g].append(i)
    return groups


def base_advantages(batch, kind: str, eps: float = 1e-8) -> list[float]:
    rewards = batch.rewards.tolist()
    adv = [0.0] * len(rewards)
    for members in groups_of(batch).values():
        r = [rewards[i] for i in members]
        k = len(r)
        if k == 1 or max(r) == min(r):
            continue
        mean = sum(r) / k
        for i, ri in zip(members, r):
            if kind == 'GRPOAdvantage':
                std = math.sqrt(sum((x - mean)**2 for x in r) / (k - 1))
                adv[i] = (ri - mean) / (std + eps)
            elif kind == 'DrGRPOAdvantage':
                adv[i] = ri - mean
            elif kind == 'RLOOAdvantage':
                adv[i] = ri - (sum(r) - ri) / (k - 1)
            else:
                raise KeyError(kind)
    return adv


def group_entropies(batch) -> dict[int, float | None]:
    """H_g = sum of -lp over the group's tokens / number of tokens (None if no tokens)."""
    lp, mask = batch.logprobs.tolist(), batch.mask.tolist()
    out = {}
    for g, members in groups_of(batch).items():
        total, tokens = 0.0, 0
        for i in members:
            for v, m in zip(lp[i], mask[i]):
                if m:
                    total -= v
                    tokens += 1
        out[g] = total / tokens if tokens else None
    return out


class ReferenceGEPO:
    """Loop implementation of GEPO shaping with the EMA band across steps."""

    def __init__(self, alpha_low, alpha_high, beta_low, beta_high, gamma, eps=1e-8,
                 base='GRPOAdvantage'):
        self.base = base
        self.a_lo, self.a_hi = alpha_low, alpha_high
        self.b_lo, self.b_hi, self.gamma, self.eps = beta_low, beta_high, gamma, eps
        self.h_low = self.h_high = None

    def step(self, batch):
        adv = base_advantages(batch, self.base, self.eps)
        ents = group_entropies(batch)
        valid = [h for h in ents.values() if h is not None]
        if not valid:
            return adv, None
        mu = sum(valid) / len(valid)
        sigma = math.sqrt(sum((h - mu)**2 for h in valid) / len(valid))
        hat_lo, hat_hi = mu - self.b_lo * sigma, mu + self.b_hi * sigma
        if self.h_low is None:
            self.h_low, self.h_high = hat_lo, hat_hi
        used = (self.h_low, self.h_high, mu, sigma)
        gid = batch.group_ids.tolist()
        for i, a in enumerate(adv):
            h = ents[gid[i]]
            if h is None:
                continue
            if a > 0 and h < self.h_low:
                adv[i] = self.a_lo * a
            elif a < 0 and h > self.h_high:
                adv[i] = self.a_hi * a
        self.h_low = (1 - self.gamma) * self.h_low + self.gamma * hat_lo
        self.h_high = (1 - self.gamma) * self.h_high + self.gamma * hat_hi
        return adv, used


class ReferenceAEPO:
    """Loop implementation of the AEPO gate as the authors' code states it.

    Batch entropy: token-mean of the per-token entropies (``-logprobs`` when the
    batch has no full-vocabulary entropies). Gate on when ``lo < H < hi``
    (``'band'``), or on above ``hi`` / off below ``lo`` (``'hysteresis'``). When on,
    only responses with positive advantage and positive reward are kept.
    """

    def __init__(self, entropy_low, entropy_high=None, gate='band', eps=1e-8,
                 base='GRPOAdvantage'):
        self.lo, self.eps, self.gate, self.on = entropy_low, eps, gate, False
        self.base = base
        self.hi = math.inf if entropy_high is None else entropy_high

    def step(self, batch):
        """Returns ``(advantages, keep)`` as lists."""
        adv = base_advantages(batch, self.base, self.eps)
        values = batch.entropies if batch.entropies is not None else -batch.logprobs
        toks = [v for row, m in zip(values.tolist(), batch.mask.tolist())
                for v, k in zip(row, m) if k]
        keep = [True] * len(adv)
        if not toks:
            return adv, keep
        ent = sum(toks) / len(toks)
        if self.gate == 'band':
            self.on = self.lo < ent < self.hi
        elif not self.on and ent > self.hi:
            self.on = True
        elif self.on and ent < self.lo:
            self.on = False
        if self.on:
            rewards = batch.rewards.tolist()
            keep = [a > 0 and r > 0 for a, r in zip(adv, rewards)]
            adv = [a if k else 0.0 for a, k in zip(adv, keep)]
        return adv, keep
        ent = sum(per_seq) / len(per_seq)
        if not self.on and ent > self.hi:
            self.on = True
        elif self.on and ent < self.lo:
            self.on = False
        if self.on:
            adv = [0.0 if a < 0 else a for a in adv]
        return adv
