"""Tests for PPOClipLoss against a per-token plain-Python reference."""

import math

import pytest
import torch

from .cases import agg_weights, random_case, to_tensors, token_adv
from gepo_xtuner.loss import PPOClipLoss

AGGS = ('token-mean', 'seq-mean-token-mean')


def ref_ppo(lp, old, adv, mask, agg, clip_low, clip_high, dual_clip=None):
    """Returns loss, gradient w.r.t. lp (nested lists) and clip fractions."""
    weights = agg_weights(mask, agg)
    loss, grad = 0.0, [[0.0] * len(row) for row in lp]
    flags = {'clipfrac': 0, 'clipfrac_low': 0, 'clipfrac_high': 0, 'dual_clipfrac': 0}
    for i, row in enumerate(lp):
        for t, x in enumerate(row):
            if not mask[i][t]:
                continue
            a = token_adv(adv, i, t)
            rho = math.exp(x - old[i][t])
            l1 = -a * rho
            l2 = -a * min(max(rho, 1 - clip_low), 1 + clip_high)
            if l2 > l1:
                value, dvalue = l2, 0.0
                flags['clipfrac'] += 1
            else:
                value, dvalue = l1, -a * rho
            flags['clipfrac_low'] += rho < 1 - clip_low and a < 0
            flags['clipfrac_high'] += rho > 1 + clip_high and a > 0
            if dual_clip is not None and a < 0 and value > -a * dual_clip:
                value, dvalue = -a * dual_clip, 0.0
                flags['dual_clipfrac'] += 1
            loss += weights[i][t] * value
            grad[i][t] = weights[i][t] * dvalue
    n_valid = sum(map(sum, mask))
    return loss, grad, {k: v / max(n_valid, 1) for k, v in flags.items()}


@pytest.mark.parametrize('agg', AGGS)
@pytest.mark.parametrize('seed', range(20))
@pytest.mark.parametrize('clips', [(0.2, 0.2, None), (0.2, 0.28, None), (0.1, 0.3, 1.5)])
def test_matches_reference(seed, agg, clips):
    lp, old, adv, mask = random_case(seed)
    clip_low, clip_high, dual_clip = clips
    lp_t, old_t, adv_t, mask_t = to_tensors(lp, old, adv, mask)
    loss, metrics = PPOClipLoss(clip_low=clip_low, clip_high=clip_high,
                                dual_clip=dual_clip, agg=agg)(lp_t, old_t, adv_t, mask_t)
    loss.backward()
    ref_loss, ref_grad, ref_flags = ref_ppo(lp, old, adv, mask, agg, *clips)
    assert loss.item() == pytest.approx(ref_loss, abs=1e-6, rel=1e-6)
    torch.testing.assert_close(lp_t.grad, torch.tensor(ref_grad, dtype=torch.float64),
                               atol=1e-6, rtol=1e-6)
    for name, value in ref_flags.items():
        assert metrics[f'loss/{name}'].item() == pytest.approx(value, abs=1e-12), name
    valid = [math.exp(x - o) for r, ro, rm in zip(lp, old, mask)
             for x, o, m in zip(r, ro, rm) if m] or [0.0]
    kl = [(r - 1) - math.log(r) if r else 0.0 for r in valid]
    assert metrics['ratio/mean'].item() == pytest.approx(sum(valid) / len(valid))
    assert metrics['ratio/max'].item() == pytest.approx(max(valid))
    assert metrics['ratio/min'].item() == pytest.approx(min(valid))
    assert metrics['loss/approx_kl'].item() == pytest.approx(sum(kl) / len(kl))
    assert metrics['loss/pg'].item() == loss.item()


def test_metrics_are_detached_0dim_tensors():
    lp_t, old_t, adv_t, mask_t = to_tensors(*random_case(3))
    _, metrics = PPOClipLoss(dual_clip=3.0)(lp_t, old_t, adv_t, mask_t)
    assert {'loss/pg', 'ratio/mean', 'ratio/max', 'ratio/min', 'loss/approx_kl',
            'loss/clipfrac', 'loss/clipfrac_low', 'loss/clipfrac_high',
            'loss/dual_clipfrac'} <= set(metrics)
    for value in metrics.values():
        assert isinstance(value, torch.Tensor) and value.dim() == 0
        assert value.is_floating_point() and not value.requires_grad


def test_clip_fractions_on_constructed_tokens():
    # (rho, A): low-clipped, unclipped, high-clipped, unclipped, unclipped, unclipped.
    tokens = [(0.5, -1.0), (0.5, 1.0), (1.5, 2.0), (1.5, -1.0), (1.0, 1.0), (1.1, -1.0)]
    rho = torch.tensor([[r for r, _ in tokens] + [3.0]], dtype=torch.float64)
    adv = torch.tensor([[a for _, a in tokens] + [1.0]], dtype=torch.float64)
    mask = torch.tensor([[True] * 6 + [False]])  # padded token would be high-clipped
    lp = rho.log().requires_grad_()
    loss, m = PPOClipLoss()(lp, torch.zeros_like(rho), adv, mask)
    loss.backward()
    assert m['loss/clipfrac'].item() == pytest.approx(2 / 6)
    assert m['loss/clipfrac_low'].item() == pytest.approx(1 / 6)
    assert m['loss/clipfrac_high'].item() == pytest.approx(1 / 6)
    assert m['loss/dual_clipfrac'].item() == 0.0
    expected = [0.0, -0.5, 0.0, 1.5, -1.0, 1.1, 0.0]  # -A rho / 6, clipped -> 0
    torch.testing.assert_close(lp.grad * 6, torch.tensor([expected], dtype=torch.float64))
    values = [0.8, -0.5, -2.0 * 1.2, 1.5, -1.0, 1.1]
    assert loss.item() == pytest.approx(sum(values) / 6)


def test_dual_clip_only_for_negative_advantage_above_c():
    tokens = [(4.0, -1.0), (4.0, 1.0), (2.0, -1.0), (0.5, -1.0), (3.5, -2.0)]
    rho = torch.tensor([[r for r, _ in tokens]], dtype=torch.float64)
    adv = torch.tensor([[a for _, a in tokens]], dtype=torch.float64)
    lp = rho.log().requires_grad_()
    loss, m = PPOClipLoss(dual_clip=3.0)(lp, torch.zeros_like(rho), adv,
                                         torch.ones_like(rho, dtype=torch.bool))
    loss.backward()
    assert m['loss/dual_clipfrac'].item() == pytest.approx(2 / 5)
    # per token: 3 (dual), -1.2 (high clip), 2 (unclipped), 0.8 (low clip), 6 (dual)
    assert loss.item() == pytest.approx((3.0 - 1.2 + 2.0 + 0.8 + 6.0) / 5)
    torch.testing.assert_close(lp.grad * 5, torch.tensor([[0.0, 0.0, 2.0, 0.0, 0.0]],
                                                         dtype=torch.float64))
    _, m_off = PPOClipLoss()(lp, torch.zeros_like(rho), adv, torch.ones_like(rho))
    assert m_off['loss/dual_clipfrac'].item() == 0.0


@pytest.mark.parametrize('agg', AGGS)
def test_empty_mask_gives_zero_and_finite_metrics(agg):
    lp = torch.randn(2, 3, requires_grad=True)
    loss, metrics = PPOClipLoss(dual_clip=2.0, agg=agg)(
        lp, torch.full((2, 3), math.nan), torch.randn(2), torch.zeros(2, 3))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros_like(lp))
    assert all(torch.isfinite(v) for v in metrics.values())


def test_low_precision_inputs_computed_in_float32():
    torch.manual_seed(0)
    lp = torch.randn(3, 4).bfloat16().requires_grad_()
    loss, metrics = PPOClipLoss()(lp, lp.detach() + 0.1, torch.randn(3, 4).bfloat16(),
                                  torch.ones(3, 4, dtype=torch.bool))
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert lp.grad.dtype == torch.bfloat16
    assert metrics['ratio/mean'].item() == pytest.approx(math.exp(-0.1), abs=2e-2)


def test_extreme_log_ratio_is_clamped_not_inf():
    lp = torch.tensor([[0.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-1000.0, -1.0]])
    loss, metrics = PPOClipLoss()(lp, old, torch.tensor([-1.0]), torch.ones(1, 2))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    assert metrics['ratio/max'].item() == pytest.approx(math.exp(20.0), rel=1e-5)


def test_advantage_shape_is_checked():
    with pytest.raises(ValueError, match='advantages'):
        PPOClipLoss()(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))
