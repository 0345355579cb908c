"""Vectorised advantage processors vs the plain-Python reference, over many seeds."""

import math
import random

import pytest
import torch

from gepo_xtuner.advantage import AdvantageInputs
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
    assert not out.shaped.any()


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
            got = [out.metrics[k] for k in ('gepo/h_low', 'gepo/h_high', 'gepo/group_nll_mu', 'gepo/group_nll_sigma')]
            assert_close(got, list(used), tol=1e-6)  # float32 token sums
        assert math.isclose(state.h_low, ref.h_low, rel_tol=1e-6, abs_tol=1e-9)
        changed = (out.advantages != out.raw_advantages).tolist()
        flagged = out.shaped.tolist()
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
    batch = AdvantageInputs(rewards=torch.tensor([1., 0.] * 3),
                         group_ids=torch.tensor([0, 0, 1, 1, 2, 2]),
                         logprobs=lp, mask=torch.ones_like(lp, dtype=torch.bool))
    out = proc(batch, state)
    a = 0.5 / (math.sqrt(0.5) + 1e-8)  # GRPO: +-0.5 / unbiased std sqrt(0.5)
    # band = [mu, mu] = [0.5, 0.5]: group 0 positive scaled by 0.5, group 2 negative by 0.2
    assert_close(out.advantages.tolist(), [0.5 * a, -a, a, -a, a, -0.2 * a])
    assert out.damped_positive.tolist() == [True, False, False, False, False, False]
    assert out.damped_negative.tolist() == [False, False, False, False, False, True]
    assert state.num_updates == 1 and math.isclose(state.h_low, 0.5)


@pytest.mark.parametrize('seed', range(30))
@pytest.mark.parametrize('gate', ['band', 'hysteresis'])
def test_aepo_matches_reference(seed, gate, make_batch):
    rng = random.Random(5000 + seed)
    lo = rng.uniform(0.2, 1.5)
    high = lo + rng.uniform(0, 0.8) if gate == 'hysteresis' or seed % 2 else None
    cfg = dict(entropy_low=lo, entropy_high=high, gate=gate)
    proc = ADVANTAGES.build(dict(type='AEPOAdvantage', **cfg))
    ref = ReferenceAEPO(**cfg)
    state = proc.init_state()
    for i in range(6):
        batch = make_batch(rng)
        if i % 2:  # full-vocabulary entropies, as the training loop passes them
            batch.entropies = torch.rand(batch.mask.shape, generator=torch.Generator().manual_seed(i)) * 2
        out = proc(batch, state)
        ref_adv, ref_keep = ref.step(batch)
        assert_close(out.advantages.tolist(), ref_adv)
        assert state.positive_only == ref.on
        keep = out.keep.tolist() if out.keep is not None else [True] * len(ref_keep)
        assert keep == ref_keep


def test_aepo_removes_non_positive_samples_when_the_gate_is_on():
    # two groups; rewards (1, 0) and (2, 2): only the first group's winner stays
    batch = AdvantageInputs(rewards=torch.tensor([1.0, 0.0, 2.0, 2.0]),
                         group_ids=torch.tensor([0, 0, 1, 1]),
                         logprobs=torch.full((4, 2), -1.0), mask=torch.ones(4, 2, dtype=torch.bool),
                         entropies=torch.full((4, 2), 0.9))
    proc = ADVANTAGES.build(dict(type='AEPOAdvantage', entropy_low=0.5))
    out = proc(batch, proc.init_state())
    assert out.keep.tolist() == [True, False, False, False]
    assert out.metrics['aepo/batch_policy_entropy'] == pytest.approx(0.9)  # entropies, not -logprobs
    assert out.advantages[1:].abs().sum() == 0
    quiet = ADVANTAGES.build(dict(type='AEPOAdvantage', entropy_low=0.95))
    assert quiet(batch, quiet.init_state()).keep is None  # gate off: every row trains
