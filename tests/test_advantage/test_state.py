"""Threshold and gate state: checkpoint round trips continue bit for bit."""

import io
import random

import pytest
import torch

from gepo_xtuner.advantage import EntropyThresholdState
from gepo_xtuner.registry import ADVANTAGES

from ..conftest import random_batch


def torch_roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize('name', ['GEPOAdvantage', 'AEPOAdvantage'])
def test_resume_from_state_dict_is_bit_exact(name):
    proc = ADVANTAGES.build(dict(type=name, **({'gamma': 0.3} if name == 'GEPOAdvantage' else
                                               {'entropy_low': 0.5, 'entropy_high': 0.9})))
    rng = random.Random(3)
    batches = [random_batch(rng) for _ in range(8)]
    straight = proc.init_state()
    outs = [proc(b, straight) for b in batches]
    first = proc.init_state()
    for b in batches[:5]:
        proc(b, first)
    resumed = proc.init_state()
    resumed.load_state_dict(torch_roundtrip(first.state_dict()))  # plain types: weights_only ok
    for b, expected in zip(batches[5:], outs[5:]):
        got = proc(b, resumed)
        assert torch.equal(got.advantages, expected.advantages)
        assert got.metrics == pytest.approx(expected.metrics, nan_ok=True, rel=0, abs=0)
    assert resumed.state_dict() == straight.state_dict()


def test_state_dict_content():
    state = EntropyThresholdState(beta_low=0.2, beta_high=0.3, gamma=0.01)
    used = state.update(mu=0.6, sigma=0.1)
    assert used == pytest.approx((0.58, 0.63))  # first step shapes with its own band
    state.update(mu=1.6, sigma=0.1)  # H(2) = 0.99 H(1) + 0.01 Hhat(1)
    assert state.state_dict() == dict(
        h_low=pytest.approx(0.99 * 0.58 + 0.01 * 1.58), h_high=pytest.approx(0.99 * 0.63 + 0.01 * 1.63),
        num_updates=2, config=dict(beta_low=0.2, beta_high=0.3, gamma=0.01))


def test_load_state_dict_checks_fields_and_warns_on_config_change():
    state = EntropyThresholdState(0.2, 0.3, 0.01)
    with pytest.raises(KeyError, match='missing'):
        state.load_state_dict({'h_low': 0.1})
    saved = EntropyThresholdState(0.5, 0.3, 0.01)
    saved.update(1.0, 0.5)
    with pytest.warns(UserWarning, match='saved with'):
        state.load_state_dict(saved.state_dict())
    assert state.h_low == saved.h_low and state.beta_low == 0.2
