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

    def __init__(self, alpha_low, alpha_high, beta_low, beta_high, gamma, eps=1e-8):
        self.a_lo, self.a_hi = alpha_low, alpha_high
        self.b_lo, self.b_hi, self.gamma, self.eps = beta_low, beta_high, gamma, eps
        self.h_low = self.h_high = None

    def step(self, batch):
        adv = base_advantages(batch, 'GRPOAdvantage', self.eps)
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
    """Loop implementation of the AEPO gate with hysteresis."""

    def __init__(self, entropy_low, entropy_high, eps=1e-8):
        self.lo, self.hi, self.eps, self.on = entropy_low, entropy_high, eps, False

    def step(self, batch):
        adv = base_advantages(batch, 'GRPOAdvantage', self.eps)
        lp, mask = batch.logprobs.tolist(), batch.mask.tolist()
        per_seq = []
        for row, m in zip(lp, mask):
            toks = [-v for v, k in zip(row, m) if k]
            if toks:
                per_seq.append(sum(toks) / len(toks))
        if not per_seq:
            return adv
        ent = sum(per_seq) / len(per_seq)
        if not self.on and ent > self.hi:
            self.on = True
        elif self.on and ent < self.lo:
            self.on = False
        if self.on:
            adv = [0.0 if a < 0 else a for a in adv]
        return adv
