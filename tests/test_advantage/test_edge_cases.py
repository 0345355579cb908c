"""Edge cases every processor must handle: singletons, ties, empty responses, bad input."""

import math

import pytest
import torch

from gepo_xtuner.advantage import AdvantageInputs
from gepo_xtuner.registry import ADVANTAGES

ALL = ['GRPOAdvantage', 'DrGRPOAdvantage', 'RLOOAdvantage', 'GEPOAdvantage', 'AEPOAdvantage']


def run(name, batch, **cfg):
    proc = ADVANTAGES.build(dict(type=name, **cfg))
    return proc(batch, proc.init_state())


def batch_of(rewards, groups, lengths=None, lp=-0.5):
    n = len(rewards)
    lengths = lengths or [3] * n
    t = max(1, max(lengths))
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    return AdvantageInputs(rewards=torch.tensor(rewards, dtype=torch.float32),
                        group_ids=torch.tensor(groups), logprobs=torch.full((n, t), lp),
                        mask=mask)


@pytest.mark.parametrize('name', ALL)
def test_singleton_group_gets_zero(name):
    out = run(name, batch_of([3.0, 1.0, 0.0], [7, 9, 9]))
    assert out.advantages[0] == 0.0
    assert not torch.isnan(out.advantages).any()


@pytest.mark.parametrize('name', ALL)
@pytest.mark.parametrize('value', [0.0, 0.1, 1.0, -3.7, 1e6])
def test_all_equal_rewards_give_exact_zero(name, value):
    out = run(name, batch_of([value] * 5, [1] * 5))
    assert out.advantages.tolist() == [0.0] * 5


@pytest.mark.parametrize('name', ALL)
def test_zero_length_responses(name):
    # group 1 has no tokens at all; group 2 has one empty response among non-empty ones
    batch = batch_of([1.0, 0.0, 1.0, 0.0, 0.0], [1, 1, 2, 2, 2], lengths=[0, 0, 4, 0, 2])
    out = run(name, batch)
    assert math.isnan(out.group_entropy[0]) and math.isnan(out.group_entropy[1])
    assert math.isclose(float(out.group_entropy[2]), 0.5, rel_tol=1e-6)  # tokens only
    assert not torch.isnan(out.advantages).any()
    if name == 'GEPOAdvantage':
        assert out.metrics['gepo/num_groups'] == 1.0  # the empty group is left out
        assert not out.shaped[:2].any()


def test_gepo_all_groups_empty_leaves_state_untouched():
    proc = ADVANTAGES.build(dict(type='GEPOAdvantage'))
    state = proc.init_state()
    out = proc(batch_of([1.0, 0.0], [1, 1], lengths=[0, 0]), state)
    assert state.num_updates == 0 and state.h_low is None
    assert out.advantages.tolist() == out.raw_advantages.tolist()
    assert math.isnan(out.metrics['gepo/group_nll_mu'])


@pytest.mark.parametrize('name', ALL)
def test_batch_of_one_group(name):
    out = run(name, batch_of([1.0, 0.0, 0.0, 1.0], [4] * 4))
    assert out.advantages.abs().sum() > 0
    if name == 'GEPOAdvantage':
        # sigma = 0, so the band collapses onto mu = H_g; strict inequalities shape nothing
        assert out.metrics['gepo/group_nll_sigma'] == 0.0
        assert not out.shaped.any()


@pytest.mark.parametrize('name', ALL)
@pytest.mark.parametrize('bad', [math.nan, math.inf, -math.inf])
def test_non_finite_reward_is_refused_naming_the_prompt(name, bad):
    batch = batch_of([1.0, bad, 0.0], [1, 1, 1])
    batch.prompt_ids = ['p-a', 'p-b', 'p-c']
    with pytest.raises(ValueError, match=r"non-finite reward .* response 1 of prompt 'p-b'"):
        run(name, batch)


def test_float_mask_equals_bool_mask():
    batch = batch_of([1.0, 0.0, 0.5, 0.2], [1, 1, 2, 2], lengths=[1, 2, 3, 0])
    proc = ADVANTAGES.build(dict(type='GEPOAdvantage'))
    a = proc(batch, proc.init_state())
    batch.mask = batch.mask.float()
    b = proc(batch, proc.init_state())
    assert torch.equal(a.advantages, b.advantages)
    assert torch.equal(a.group_entropy.nan_to_num(-1), b.group_entropy.nan_to_num(-1))


@pytest.mark.parametrize('name', ['GEPOAdvantage', 'AEPOAdvantage'])
def test_stateful_processors_need_state_and_logprobs(name):
    proc = ADVANTAGES.build(dict(type=name))
    batch = batch_of([1.0, 0.0], [1, 1])
    with pytest.raises(TypeError, match='init_state'):
        proc(batch)
    with pytest.raises(ValueError, match='logprobs'):
        proc(AdvantageInputs(rewards=batch.rewards, group_ids=batch.group_ids), proc.init_state())


@pytest.mark.parametrize('field,value,match', [
    ('group_ids', torch.tensor([1, 1, 1]), r'group_ids must have shape \(2,\)'),
    ('mask', None, 'logprobs and mask must be given together'),
    ('rewards', torch.tensor([1, 0]), 'float tensor'),
    ('logprobs', torch.zeros(3, 3), r'logprobs must have shape \(2, T\)'),
])
def test_malformed_batch_errors_say_what_to_fix(field, value, match):
    batch = batch_of([1.0, 0.0], [1, 1])
    setattr(batch, field, value)
    with pytest.raises(ValueError, match=match):
        ADVANTAGES.build(dict(type='GRPOAdvantage'))(batch)


@pytest.mark.parametrize('cfg,match', [
    (dict(alpha_low=1.5), 'alpha_low must be in'),
    (dict(alpha_high=-0.1), 'alpha_high must be in'),
    (dict(beta_low=-1), 'beta_low'),
    (dict(gamma=0.0), r'gamma must be in \(0'),
    (dict(eps=0), 'eps must be > 0'),
])
def test_gepo_config_validation(cfg, match):
    with pytest.raises(ValueError, match=match):
        ADVANTAGES.build(dict(type='GEPOAdvantage', **cfg))


def test_aepo_config_validation():
    with pytest.raises(ValueError, match='entropy_low <= entropy_high'):
        ADVANTAGES.build(dict(type='AEPOAdvantage', entropy_low=0.9, entropy_high=0.1))
    with pytest.raises(ValueError, match='gate must be one of'):
        ADVANTAGES.build(dict(type='AEPOAdvantage', gate='sometimes'))
    with pytest.raises(ValueError, match='needs entropy_high'):
        ADVANTAGES.build(dict(type='AEPOAdvantage', gate='hysteresis'))


@pytest.mark.gpu  # skipped without CUDA (tests/conftest.py)
def test_gepo_on_cuda_matches_cpu():
    batch = batch_of([1.0, 0.0, 0.5, 0.2, 1.0, 1.0], [1, 1, 2, 2, 3, 3],
                     lengths=[1, 2, 3, 0, 2, 2])
    proc = ADVANTAGES.build(dict(type='GEPOAdvantage', beta_low=0.0, beta_high=0.0))
    cpu = proc(batch, proc.init_state())
    gpu_batch = AdvantageInputs(*(t.cuda() for t in (batch.rewards, batch.group_ids, batch.logprobs,
                                                   batch.mask)))
    gpu = proc(gpu_batch, proc.init_state())
    assert gpu.advantages.is_cuda
    torch.testing.assert_close(gpu.advantages.cpu(), cpu.advantages)
