"""Tests for CISPOLoss against a per-token plain-Python reference."""

import math

import pytest
import torch

from .cases import agg_weights, random_case, to_tensors
from gepo_xtuner.loss import CISPOLoss, PPOClipLoss

AGGS = ('token-mean', 'seq-mean-token-mean')


def ref_cispo(lp, old, adv, mask, agg, eps_low, eps_high):
    """Returns loss, gradient w.r.t. lp and (clipfrac, low, high)."""
    lower, upper = max(0.0, 1.0 - eps_low), 1.0 + eps_high
    weights = agg_weights(mask, agg)
    loss, grad, low, high = 0.0, [[0.0] * len(row) for row in lp], 0, 0
    for i, row in enumerate(lp):
        for t, x in enumerate(row):
            if not mask[i][t]:
                continue
            a = adv[i][t] if isinstance(adv[i], list) else adv[i]
            rho = math.exp(x - old[i][t])
            w = min(max(rho, lower), upper)
            low += rho < lower
            high += rho > upper
            loss += weights[i][t] * (-w * a * x)
            grad[i][t] = weights[i][t] * (-w * a)
    n = max(sum(map(sum, mask)), 1)
    return loss, grad, ((low + high) / n, low / n, high / n)


@pytest.mark.parametrize('agg', AGGS)
@pytest.mark.parametrize('seed', range(20))
@pytest.mark.parametrize('eps', [(1.0, 4.0), (10.0, 0.2), (0.3, 0.5), (1.0, 5.0)])
def test_matches_reference(seed, agg, eps):
    lp, old, adv, mask = random_case(1000 + seed, old_shift=(-2.0, 1.0))
    lp_t, old_t, adv_t, mask_t = to_tensors(lp, old, adv, mask)
    loss, metrics = CISPOLoss(eps_low=eps[0], eps_high=eps[1], agg=agg)(
        lp_t, old_t, adv_t, mask_t)
    loss.backward()
    ref_loss, ref_grad, fracs = ref_cispo(lp, old, adv, mask, agg, *eps)
    assert loss.item() == pytest.approx(ref_loss, abs=1e-6, rel=1e-6)
    torch.testing.assert_close(lp_t.grad, torch.tensor(ref_grad, dtype=torch.float64),
                               atol=1e-6, rtol=1e-6)
    for name, value in zip(('clipfrac', 'clipfrac_low', 'clipfrac_high'), fracs):
        assert metrics[f'loss/{name}'].item() == pytest.approx(value, abs=1e-12), name
    assert metrics['loss/pg'].item() == loss.item()
    assert {'ratio/mean', 'ratio/max', 'ratio/min', 'loss/approx_kl'} <= set(metrics)


def test_clipped_token_keeps_gradient_unlike_ppo():
    # rho = 10 > 1 + eps_high = 5 (CISPO) and > 1.2 (PPO), positive advantage.
    lp = torch.tensor([[math.log(10.0) - 2.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-2.0]], dtype=torch.float64)
    adv, mask = torch.tensor([1.5], dtype=torch.float64), torch.ones(1, 1)
    loss, metrics = CISPOLoss()(lp, old, adv, mask)
    loss.backward()
    assert metrics['loss/clipfrac_high'].item() == 1.0
    assert lp.grad.item() == pytest.approx(-5.0 * 1.5)  # -clip(rho) * A, not zero
    lp_ppo = lp.detach().clone().requires_grad_()
    loss_ppo, metrics_ppo = PPOClipLoss()(lp_ppo, old, adv, mask)
    loss_ppo.backward()
    assert metrics_ppo['loss/clipfrac'].item() == 1.0
    assert lp_ppo.grad.item() == 0.0


@pytest.mark.parametrize('agg', AGGS)
@pytest.mark.parametrize('seed', range(5))
def test_gradient_equals_ppo_on_policy(seed, agg):
    gen = torch.Generator().manual_seed(seed)
    lp = -torch.rand(4, 6, generator=gen, dtype=torch.float64) * 3
    adv = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    mask = torch.rand(4, 6, generator=gen) < 0.7
    grads = []
    for fn in (CISPOLoss(agg=agg), PPOClipLoss(agg=agg)):
        x = lp.clone().requires_grad_()
        fn(x, lp, adv, mask)[0].backward()  # old == current: rho == 1
        grads.append(x.grad)
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], atol=1e-12, rtol=0)


def test_lower_bound_clips_only_when_enabled():
    rho = torch.tensor([[0.2, 0.6, 1.0]], dtype=torch.float64)
    args = (rho.log(), torch.zeros_like(rho), torch.tensor([1.0], dtype=torch.float64),
            torch.ones_like(rho))
    assert CISPOLoss()(*args)[1]['loss/clipfrac_low'].item() == 0.0  # lower bound 0
    assert CISPOLoss(eps_low=0.5)(*args)[1]['loss/clipfrac_low'].item() == \
        pytest.approx(1 / 3)


@pytest.mark.parametrize('agg', AGGS)
def test_empty_mask_gives_zero(agg):
    lp = torch.randn(2, 3, requires_grad=True)
    loss, metrics = CISPOLoss(agg=agg)(lp, torch.randn(2, 3), torch.randn(2, 3),
                                       torch.zeros(2, 3, dtype=torch.bool))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros_like(lp))
    assert all(torch.isfinite(v) for v in metrics.values())
