"""Vectorised advantage processors vs the plain-Python reference, over many seeds."""

import math
import random

import pytest
import torch

from gepo_xtuner.advantage import RolloutBatch
from gepo_xtuner.registry import ADVANTAGES

from .reference import ReferenceAEPO, ReferenceGEPO, base_advantages, group_entropies

SEEDS = range(60)


def assert_close(actual, expected, tol=1e-6):
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert math.isclose(a, e, rel_tol=tol, abs_tol=tol), f'item {i}: {a} != {e}'


@pytest.mark.parametrize('name', ['GRPOAdvantage', 'DrGRPOAdvantage', 'RLOOAdvantage'])
@pytest.mark.parametrize('seed', SEEDS)
def test_group_estimators_match_reference(name, seed, make_batch):
    batch = make_batch(random.Random(seed))
    out = ADVANTAGES.build(dict(type=name))(batch)
    assert_close(out.advantages.tolist(), base_advantages(batch, name))
    assert out.advantages.dtype == torch.float32
    assert not out.shaped_low.any() and not out.shaped_high.any()


@pytest.mark.parametrize('seed', SEEDS)
def test_group_entropy_matches_reference(seed, make_batch):
    batch = make_batch(random.Random(seed))
    out = ADVANTAGES.build(dict(type='GRPOAdvantage'))(batch)
    ref = group_entropies(batch)
    for i, g in enumerate(batch.group_ids.tolist()):
        got = float(out.group_entropy[i])
        if ref[g] is None:
            assert math.isnan(got)
        else:
            assert math.isclose(got, ref[g], rel_tol=1e-6)


@pytest.mark.parametrize('seed', SEEDS)
def test_gepo_matches_reference_across_steps(seed, make_batch):
    rng = random.Random(1000 + seed)
    cfg = dict(alpha_low=rng.uniform(0, 1), alpha_high=rng.uniform(0, 1),
               beta_low=rng.uniform(0, 1), beta_high=rng.uniform(0, 1),
               gamma=rng.uniform(0.01, 1))
    proc = ADVANTAGES.build(dict(type='GEPOAdvantage', **cfg))
    ref = ReferenceGEPO(**cfg)
    state = proc.init_state()
    shaped_any = False
    for _ in range(4):
        batch = make_batch(rng)
        out = proc(batch, state)
        expected, used = ref.step(batch)
        assert_close(out.advantages.tolist(), expected)
        if used is not None:
            got = [out.metrics[k] for k in ('gepo/h_low', 'gepo/h_high', 'gepo/mu', 'gepo/sigma')]
            assert_close(got, list(used), tol=1e-6)  # float32 token sums
        assert math.isclose(state.h_low, ref.h_low, rel_tol=1e-6, abs_tol=1e-9)
        changed = (out.advantages != out.raw_advantages).tolist()
        flagged = (out.shaped_low | out.shaped_high).tolist()
        # a flag may sit on a response whose alpha is 1 (no change), never the reverse
        assert all(f for c, f in zip(changed, flagged) if c)
        shaped_any |= any(flagged)
    if seed == 0:
        assert shaped_any, 'the random batches never exercised shaping'


def test_gepo_shapes_exactly_the_paper_cases():
    """Two hand-built steps: which responses are scaled, and by what, is known."""
    proc = ADVANTAGES.build(dict(type='GEPOAdvantage', alpha_low=0.5, alpha_high=0.2,
                                 beta_low=0.0, beta_high=0.0, gamma=0.5))
    state = proc.init_state()
    # groups 0/1/2 with per-token entropy 0.25 / 0.5 / 0.75 (exact in float32); rewards [1, 0]
    ents = [0.25, 0.5, 0.75]
    lp = torch.tensor([[-e, -e] for e in ents for _ in range(2)])
    batch = RolloutBatch(rewards=torch.tensor([1., 0.] * 3),
                         group_ids=torch.tensor([0, 0, 1, 1, 2, 2]),
                         logprobs=lp, mask=torch.ones_like(lp, dtype=torch.bool))
    out = proc(batch, state)
    a = 0.5 / (math.sqrt(0.5) + 1e-8)  # GRPO: +-0.5 / unbiased std sqrt(0.5)
    # band = [mu, mu] = [0.5, 0.5]: group 0 positive scaled by 0.5, group 2 negative by 0.2
    assert_close(out.advantages.tolist(), [0.5 * a, -a, a, -a, a, -0.2 * a])
    assert out.shaped_low.tolist() == [True, False, False, False, False, False]
    assert out.shaped_high.tolist() == [False, False, False, False, False, True]
    assert state.num_updates == 1 and math.isclose(state.h_low, 0.5)


@pytest.mark.parametrize('seed', range(30))
def test_aepo_matches_reference(seed, make_batch):
    rng = random.Random(5000 + seed)
    lo = rng.uniform(0.2, 1.5)
    cfg = dict(entropy_low=lo, entropy_high=lo + rng.uniform(0, 0.8))
    proc = ADVANTAGES.build(dict(type='AEPOAdvantage', **cfg))
    ref = ReferenceAEPO(**cfg)
    state = proc.init_state()
    for _ in range(6):
        batch = make_batch(rng)
        out = proc(batch, state)
        assert_close(out.advantages.tolist(), ref.step(batch))
        assert state.positive_only == ref.on
