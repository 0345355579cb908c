"""Every registered advantage processor against the contract of ``AdvantageProcessor``.

The registry is read at test time, so a processor added later is checked without
editing this file: shapes and dtypes, groups of one, a state that round-trips through
``state_dict`` and continues exactly, and, for shapers, every estimator as a base.
"""

import copy
import random

import pytest
import torch

from gepo_xtuner.advantage import AdvantageEstimator, AdvantageOutput, AdvantageShaper
from gepo_xtuner.registry import ADVANTAGES, shipped

NAMES = sorted(shipped(ADVANTAGES))
ESTIMATORS = [n for n in NAMES if issubclass(ADVANTAGES.get(n), AdvantageEstimator)]
SHAPERS = [n for n in NAMES if issubclass(ADVANTAGES.get(n), AdvantageShaper)]


def test_every_processor_is_an_estimator_or_a_shaper():
    assert set(ESTIMATORS) | set(SHAPERS) == set(NAMES)
    assert not set(ESTIMATORS) & set(SHAPERS)
    assert {'GRPOAdvantage', 'RLOOAdvantage', 'DrGRPOAdvantage'} <= set(ESTIMATORS)
    assert {'GEPOAdvantage', 'AEPOAdvantage'} <= set(SHAPERS)


def configs() -> list[dict]:
    out = [dict(type=n) for n in NAMES]
    out += [dict(type=s, base=dict(type=e)) for s in SHAPERS for e in ESTIMATORS]
    return out


@pytest.mark.parametrize('cfg', configs(), ids=lambda c: f'{c["type"]}-{c.get("base", {}).get("type", "")}')
def test_contract(cfg, make_batch):
    proc = ADVANTAGES.build(copy.deepcopy(cfg))
    assert proc.min_group_size >= 1
    state = proc.init_state()
    rng = random.Random(7)
    batches = [make_batch(rng) for _ in range(4)]
    outs = []
    for i, batch in enumerate(batches):
        if i == 2:  # checkpoint here: a fresh processor from the saved state continues exactly
            saved = None if state is None else copy.deepcopy(state.state_dict())
        out = proc(batch, state)
        n = len(batch)
        assert isinstance(out, AdvantageOutput)
        assert out.advantages.shape == (n,) and out.advantages.dtype == torch.float32
        assert out.raw_advantages.shape == (n,) and torch.isfinite(out.advantages).all()
        for mask in (out.damped_positive, out.damped_negative):
            assert mask.shape == (n,) and mask.dtype == torch.bool
        assert out.keep is None or (out.keep.shape == (n,) and out.keep.dtype == torch.bool)
        # damping reduces a magnitude and keeps the sign; removed rows carry no advantage
        raw, adv = out.raw_advantages, out.advantages
        assert (adv.abs() <= raw.abs() + 1e-6).all()
        assert ((adv * raw) >= 0).all()
        assert (out.damped_positive <= (raw > 0)).all() and (out.damped_negative <= (raw < 0)).all()
        if out.keep is not None:
            assert (adv[~out.keep] == 0).all()
        assert all(isinstance(v, float) for v in out.metrics.values())
        outs.append(out)
    resumed = ADVANTAGES.build(copy.deepcopy(cfg))
    state2 = resumed.init_state()
    if state2 is not None:
        state2.load_state_dict(saved)
    for batch, out in zip(batches[2:], outs[2:]):
        again = resumed(batch, state2)
        assert torch.equal(again.advantages, out.advantages)


@pytest.mark.parametrize('name', NAMES)
def test_a_group_of_one_gets_zero(name):
    from gepo_xtuner.advantage import AdvantageInputs
    proc = ADVANTAGES.build(dict(type=name))
    batch = AdvantageInputs(rewards=torch.tensor([1.0, 0.0, 1.0]), group_ids=torch.tensor([0, 1, 1]),
                         logprobs=torch.full((3, 2), -1.0), mask=torch.ones(3, 2, dtype=torch.bool))
    out = proc(batch, proc.init_state())
    assert out.advantages[0] == 0
