"""Shapers compose with any estimator: GEPO and AEPO around RLOO and Dr.GRPO.

The reference loops are the same as for the default GRPO base, with the base's own
reference advantages; the band (GEPO) and the gate (AEPO) do not depend on the base.
"""

import math
import random

import pytest
import torch

from gepo_xtuner.advantage import (AdvantageEstimator, AdvantageShaper, GEPOAdvantage,
                                   RLOOAdvantage, AdvantageInputs)
from gepo_xtuner.registry import ADVANTAGES

from .reference import ReferenceAEPO, ReferenceGEPO
from .test_processors import assert_close

BASES = ['RLOOAdvantage', 'DrGRPOAdvantage', 'GRPOAdvantage']
SEEDS = range(20)


def replay(name, reference, cfg, base, rng, make_batch, steps=3):
    """``(output, reference output)`` per step, each side carrying its state."""
    proc = ADVANTAGES.build(dict(type=name, base=dict(type=base), **cfg))
    ref, state = reference(**cfg, base=base), proc.init_state()
    batches = [make_batch(rng) for _ in range(steps)]
    return [(proc(batch, state), ref.step(batch)) for batch in batches]


@pytest.mark.parametrize('base', BASES)
@pytest.mark.parametrize('seed', SEEDS)
def test_gepo_around_any_estimator_matches_reference(base, seed, make_batch):
    rng = random.Random(3000 + seed)
    cfg = dict(alpha_low=rng.uniform(0, 1), alpha_high=rng.uniform(0, 1),
               beta_low=rng.uniform(0, 1), beta_high=rng.uniform(0, 1),
               gamma=rng.uniform(0.01, 1))
    for out, (expected, used) in replay('GEPOAdvantage', ReferenceGEPO, cfg, base, rng,
                                        make_batch):
        assert_close(out.advantages.tolist(), expected)
        if used is not None:
            assert_close([out.band.low, out.band.high, out.band.mu, out.band.sigma], list(used))


@pytest.mark.parametrize('base', BASES)
@pytest.mark.parametrize('seed', range(8))
def test_aepo_around_any_estimator_matches_reference(base, seed, make_batch):
    rng = random.Random(4000 + seed)
    cfg = dict(entropy_low=rng.uniform(0, 0.5), entropy_high=None, gate='band')
    for out, (ref_adv, ref_keep) in replay('AEPOAdvantage', ReferenceAEPO, cfg, base, rng,
                                           make_batch):
        assert_close(out.advantages.tolist(), ref_adv)
        keep = out.keep.tolist() if out.keep is not None else [True] * len(ref_keep)
        assert keep == ref_keep


@pytest.mark.parametrize('seed', SEEDS)
def test_the_shaping_decision_does_not_depend_on_the_base(seed, make_batch):
    """RLOO's advantages are K/(K-1) times GRPO's centred ones: same signs, same groups,
    so GEPO damps the same responses by the same factors around either."""
    rng = random.Random(5000 + seed)
    batches = [make_batch(rng) for _ in range(3)]
    grpo, rloo = GEPOAdvantage(), GEPOAdvantage(base=RLOOAdvantage())
    s1, s2 = grpo.init_state(), rloo.init_state()
    for batch in batches:
        a, b = grpo(batch, s1), rloo(batch, s2)
        assert torch.equal(a.damped_positive, b.damped_positive)
        assert torch.equal(a.damped_negative, b.damped_negative)
        assert a.band == b.band or (math.isnan(a.band.mu) and math.isnan(b.band.mu))
        scale = torch.where(b.damped_positive, 0.5, torch.where(b.damped_negative, 0.2, 1.0))
        torch.testing.assert_close(b.advantages, (b.raw_advantages * scale).float())


def test_shapers_refuse_what_they_cannot_wrap():
    with pytest.raises(TypeError, match='needs an advantage estimator'):
        ADVANTAGES.build(dict(type='GEPOAdvantage', base=dict(type='AEPOAdvantage')))
    with pytest.raises(ValueError, match=r"base=dict\(type='GRPOAdvantage', eps=...\)"):
        ADVANTAGES.build(dict(type='GEPOAdvantage', eps=1e-6, base=dict(type='RLOOAdvantage')))
    assert isinstance(GEPOAdvantage().base, AdvantageEstimator)
    assert GEPOAdvantage(base=dict(type='RLOOAdvantage')).min_group_size == 2


def test_shaper_output_is_named_and_neutral():
    batch = AdvantageInputs(rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]),
                         group_ids=torch.tensor([0, 0, 1, 1]),
                         logprobs=torch.tensor([[-0.1, -0.1], [-0.1, -0.1], [-2.0, -2.0],
                                                [-2.0, -2.0]]),
                         mask=torch.ones(4, 2, dtype=torch.bool))
    proc = GEPOAdvantage(alpha_low=0.5, alpha_high=0.2, beta_low=0.0, beta_high=0.0)
    assert isinstance(proc, AdvantageShaper)
    out = proc(batch, proc.init_state())
    # group 0 is confident (low entropy): its winner is damped; group 1 explores: its loser
    assert out.damped_positive.tolist() == [True, False, False, False]
    assert out.damped_negative.tolist() == [False, False, False, True]
    assert out.shaped.tolist() == [True, False, False, True]
    assert out.metrics['shaping/frac_damped_pos'] == 0.25
    assert out.metrics['shaping/frac_removed'] == 0.0


@pytest.mark.parametrize('name', ['GEPOAdvantage', 'AEPOAdvantage'])
@pytest.mark.parametrize('seed', range(5))
def test_base_advantages_from_another_trainer_equal_the_base_estimator(name, seed, make_batch):
    """A trainer's own estimator (TRL's, slime's) passes its advantages in; when they are
    the base estimator's, every output and the state equal the processor's own path."""
    rng = random.Random(5000 + seed)
    own, given = (ADVANTAGES.build(dict(type=name, base=dict(type='RLOOAdvantage')))
                  for _ in range(2))
    own_state, given_state = own.init_state(), given.init_state()
    for _ in range(3):
        batch = make_batch(rng)
        base = RLOOAdvantage()(batch).advantages
        a = own(batch, own_state)
        b = given(batch, given_state, base_advantages=RLOOAdvantage().estimate(
            batch.rewards.double(), own._group_view(batch).segments))
        assert torch.equal(a.advantages, b.advantages) and a.metrics.keys() == b.metrics.keys()
        assert torch.equal(a.raw_advantages, base)
    if own_state is not None:
        assert own_state.state_dict() == given_state.state_dict()
    with pytest.raises(ValueError, match='base_advantages must be'):
        given(batch, given_state, base_advantages=torch.zeros(len(batch) + 1))
