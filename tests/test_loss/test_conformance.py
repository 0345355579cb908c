"""Every registered policy loss against the contract of ``PolicyLoss``.

The registry is read at test time, so a loss added later is checked without editing this
file: it subclasses ``PolicyLoss``; padding does not matter; micro-batches given the whole
batch's denominators add up to the whole batch's loss and gradient (what the RL loop's
accumulation relies on); metrics are detached scalars; the state round-trips.
"""

import pytest
import torch

from gepo_xtuner.loss import PolicyLoss
from gepo_xtuner.registry import POLICY_LOSSES, shipped

NAMES = sorted(shipped(POLICY_LOSSES))
# A covariance selection depends on the tokens of one call, so those losses are split-exact
# only where the selection is (all candidates selected, or none)
SPLIT_ARGS = {'ClipCovLoss': dict(clip_cov_ratio=0.0, clip_cov_lb=1e9, clip_cov_ub=2e9),
              'KLCovLoss': dict(ppo_kl_coef=0.0)}


def inputs(seed: int = 0, n: int = 6, t: int = 5):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=gen) * 3
    lp = (old + torch.randn(n, t, generator=gen) * 0.3).requires_grad_()
    adv = torch.randn(n, generator=gen)
    mask = torch.rand(n, t, generator=gen) < 0.8
    return lp, old, adv, mask


def test_every_registered_loss_is_a_policy_loss():
    assert {'PPOClipLoss', 'CISPOLoss', 'ClipCovLoss', 'KLCovLoss'} <= set(NAMES)
    for name in NAMES:
        assert issubclass(POLICY_LOSSES.get(name), PolicyLoss), name


@pytest.mark.parametrize('agg', ['token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum-norm'])
@pytest.mark.parametrize('name', NAMES)
def test_micro_batches_add_up_to_the_batch(name, agg):
    fn = POLICY_LOSSES.build(dict(type=name, agg=agg, **SPLIT_ARGS.get(name, {})))
    lp, old, adv, mask = inputs()
    totals = dict(num_tokens=mask.sum().float(), num_seqs=mask.any(1).sum().float(),
                  norm_length=5)
    whole, metrics = fn(lp, old, adv, mask, **totals)
    (g_whole, ) = torch.autograd.grad(whole, lp)
    parts = [fn(lp[rows], old[rows], adv[rows], mask[rows], **totals)[0]
             for rows in (slice(0, 2), slice(2, 6))]
    g_parts = torch.autograd.grad(sum(parts), lp)[0]
    torch.testing.assert_close(sum(parts), whole, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g_parts, g_whole, rtol=1e-6, atol=1e-7)
    for key, value in metrics.items():
        assert '/' in key and value.dim() == 0 and not value.requires_grad, key
    assert metrics['loss/pg'] == whole.detach()


@pytest.mark.parametrize('name', NAMES)
def test_padding_is_ignored_and_state_round_trips(name):
    fn = POLICY_LOSSES.build(dict(type=name))
    lp, old, adv, mask = inputs(1)
    state = fn.state_dict()
    loss, _ = fn(lp, old, adv, mask)
    noisy_lp = torch.where(mask, lp, torch.full_like(lp, 5.0))
    noisy_old = torch.where(mask, old, torch.full_like(old, -50.0))
    fn.load_state_dict(state)
    again, _ = fn(noisy_lp, noisy_old, adv, mask)
    assert torch.isfinite(loss)
    if name != 'ClipCovLoss':  # unseeded Clip-Cov draws from the global RNG
        torch.testing.assert_close(again, loss, rtol=0, atol=0)
    assert repr(fn).startswith(f'{name}(')
    with pytest.raises(ValueError, match='agg'):
        POLICY_LOSSES.build(dict(type=name, agg='sum'))
