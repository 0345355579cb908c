"""Behaviour correction of the policy losses (stale rollouts: mu behind pi_prox).

A hand-computed 2-row case: probabilities chosen so that every ratio and weight is a
simple number, the expected loss written out token by token for each mode.
"""

import math

import pytest
import torch

from gepo_xtuner.loss import BehaviourCorrection, PPOClipLoss, behaviour_weights
from gepo_xtuner.loss.cispo import CISPOLoss
from gepo_xtuner.registry import POLICY_LOSSES, shipped

# Row 0: A = +1, three tokens. Row 1: A = -2, two tokens and one padding column.
THETA = [[0.5, 0.7, 0.3], [0.2, 0.9, math.nan]]   # pi_theta(y_t)
PROX = [[0.5, 0.5, 0.4], [0.4, 0.6, math.nan]]    # pi_prox(y_t), the recomputed old policy
MU = [[0.25, 0.5, 0.8], [0.1, 0.6, math.nan]]     # mu(y_t), the rollout engine's
# r = theta / prox = [[1.0, 1.4, 0.75], [0.5, 1.5]];  w = prox / mu = [[2, 1, 0.5], [4, 1]]
ADV = [1.0, -2.0]
MASK = [[True, True, True], [True, True, False]]

# PPO clip 0.2, l_t = max(-A r, -A clip(r, 0.8, 1.2)):
#   row 0 (A = 1):  r=1.0 -> -1.0;  r=1.4 -> max(-1.4, -1.2) = -1.2;
#                   r=0.75 -> max(-0.75, -0.8) = -0.75
#   row 1 (A = -2): r=0.5 -> max(1.0, 1.6) = 1.6;  r=1.5 -> max(3.0, 2.4) = 3.0


def tensors(mu=MU):
    """float64 tensors; NaN at the padding column must not leak."""
    mask = torch.tensor(MASK)
    theta = torch.tensor(THETA, dtype=torch.float64).log().requires_grad_()
    prox = torch.tensor(PROX, dtype=torch.float64).log()
    mu = torch.tensor(mu, dtype=torch.float64).log()
    return theta, prox, mu, torch.tensor(ADV, dtype=torch.float64), mask


def corrected(fn, mode: str, cap: float, mu=MU):
    """The loss as the update calls it: weights, or the narrowed mask and its counts."""
    theta, prox, rollout, adv, mask = tensors(mu)
    corr = BehaviourCorrection.of(prox, rollout, mask, mode, cap)
    counted = mask if corr is None or corr.loss_mask is None else corr.loss_mask
    loss, metrics = fn(theta, prox, adv, counted, num_tokens=counted.sum().double(),
                       num_seqs=counted.any(1).sum().double(),
                       behaviour_weights=None if corr is None else corr.loss_weights)
    return loss, metrics, corr, theta


def test_weights_are_prox_over_mu_and_one_at_padding():
    _, prox, mu, _, mask = tensors()
    w = behaviour_weights(prox, mu, mask)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 0.5], [4.0, 1.0, 1.0]],
                                               dtype=torch.float64))
    assert not w.requires_grad


def test_none_token_mean_and_seq_mean_by_hand():
    loss, _, corr, _ = corrected(PPOClipLoss(), 'none', 2.0)
    assert corr is None
    # (-1.0 - 1.2 - 0.75 + 1.6 + 3.0) / 5 tokens = 1.65 / 5
    assert loss.item() == pytest.approx(0.33)
    loss, _, _, _ = corrected(PPOClipLoss(agg='seq-mean-token-mean'), 'none', 2.0)
    # row means -2.95 / 3 and 4.6 / 2 = 2.3, over 2 rows
    assert loss.item() == pytest.approx((-2.95 / 3 + 2.3) / 2)


def test_truncate_by_hand():
    loss, metrics, corr, _ = corrected(PPOClipLoss(), 'truncate', 3.0)
    # min(w, 3) = [[2, 1, 0.5], [3, 1]]:
    # (2 * -1.0 + 1 * -1.2 + 0.5 * -0.75 + 3 * 1.6 + 1 * 3.0) / 5 = (-2 - 1.2 - 0.375 + 4.8 + 3) / 5
    assert loss.item() == pytest.approx(4.225 / 5)
    assert float(metrics['loss/pg']) == pytest.approx(4.225 / 5)
    torch.testing.assert_close(corr.loss_weights[corr.mask],
                               torch.tensor([2.0, 1.0, 0.5, 3.0, 1.0], dtype=torch.float64))
    # w before the cap: mean (2 + 1 + 0.5 + 4 + 1) / 5 = 1.7, max 4, 1 of 5 above C = 3
    out = corr.metrics(corr.mode, *corr.metric_sums())
    assert out == pytest.approx({'offpolicy/weight_mean': 1.7, 'offpolicy/weight_max': 4.0,
                                 'offpolicy/frac_truncated': 0.2})


def test_truncate_keeps_the_ratio_against_prox_cispo_gradient_by_hand():
    """CISPO: d l_t / d log pi_theta = -min(w, C) * clip(r) * A / D, with r = theta / prox
    (eps_high = 4: no ratio here reaches the bound 5)."""
    loss, _, _, theta = corrected(CISPOLoss(), 'truncate', 3.0)
    (grad, ) = torch.autograd.grad(loss, theta)
    # -[w * r * A] / 5 = -[2*1.0*1, 1*1.4*1, 0.5*0.75*1, 3*0.5*(-2), 1*1.5*(-2)] / 5
    expected = -torch.tensor([[2.0, 1.4, 0.375], [-3.0, -3.0, 0.0]], dtype=torch.float64) / 5
    torch.testing.assert_close(grad, expected)


def test_mask_by_hand_changes_the_denominators():
    # C = 3: keep w in [1/3, 3]; row 1's first token (w = 4) leaves loss and count
    loss, metrics, corr, theta = corrected(PPOClipLoss(), 'mask', 3.0)
    # (-1.0 - 1.2 - 0.75 + 3.0) / 4 kept tokens (not 5)
    assert loss.item() == pytest.approx(0.05 / 4)
    assert corr.loss_mask.tolist() == [[True, True, True], [False, True, False]]
    assert corr.loss_weights is None  # kept tokens weigh 1
    (grad, ) = torch.autograd.grad(loss, theta)
    assert grad[1, 0] == 0
    assert corr.metrics(corr.mode, *corr.metric_sums()) == pytest.approx(
        {'offpolicy/weight_mean': 1.7, 'offpolicy/weight_max': 4.0, 'offpolicy/frac_masked': 0.2})
    loss, _, _, _ = corrected(PPOClipLoss(agg='seq-mean-token-mean'), 'mask', 3.0)
    # row means -2.95 / 3 and 3.0 / 1 (one kept token), over 2 rows
    assert loss.item() == pytest.approx((-2.95 / 3 + 3.0) / 2)


def test_mask_drops_a_row_without_kept_tokens_from_the_sequence_count():
    # mu of row 1 = [0.1, 0.15]: w = [4, 4], both outside [1/1.5, 1.5]; row 0 keeps only
    # its middle token (w = 1): l = -1.2
    mu = [MU[0], [0.1, 0.15, math.nan]]
    for agg in ('token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum-norm'):
        loss, _, corr, _ = corrected(PPOClipLoss(agg=agg), 'mask', 1.5, mu)
        assert corr.loss_mask.tolist() == [[False, True, False], [False, False, False]]
        # token-mean: -1.2 / 1 token; seq-mean: -1.2 / 1 row; Dr.GRPO: -1.2 / (1 row * L = 3)
        expected = -1.2 / 3 if agg == 'seq-mean-token-sum-norm' else -1.2
        assert loss.item() == pytest.approx(expected), agg


def test_equal_logprobs_give_weight_exactly_one():
    _, prox, _, _, mask = tensors()
    corr = BehaviourCorrection.of(prox, prox.clone(), mask, 'truncate', 2.0)
    assert torch.equal(corr.loss_weights, torch.ones_like(prox))
    corr = BehaviourCorrection.of(prox, prox.clone(), mask, 'mask', 1.0001)
    assert torch.equal(corr.loss_mask, mask)


@pytest.mark.parametrize('agg', ['token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum-norm'])
@pytest.mark.parametrize('name', sorted(shipped(POLICY_LOSSES)))
def test_truncate_with_behaviour_equal_to_prox_is_the_uncorrected_loss(name, agg):
    """w = exp(0) = 1 and 1 * l = l: loss, metrics and gradient bit for bit (float32)."""
    gen = torch.Generator().manual_seed(3)
    old = -torch.rand(5, 7, generator=gen) * 3
    lp = (old + torch.randn(5, 7, generator=gen) * 0.3).requires_grad_()
    adv = torch.randn(5, generator=gen)
    mask = torch.rand(5, 7, generator=gen) < 0.8
    seed = {'seed': 0} if name == 'ClipCovLoss' else {}
    corr = BehaviourCorrection.of(old, old.clone(), mask, 'truncate', 2.0)
    out = []
    for weights in (None, corr.loss_weights):
        fn = POLICY_LOSSES.build(dict(type=name, agg=agg, **seed))
        loss, metrics = fn(lp, old, adv, mask, num_tokens=mask.sum().float(), norm_length=7,
                           behaviour_weights=weights)
        out.append((loss, metrics, torch.autograd.grad(loss, lp)[0]))
    (l0, m0, g0), (l1, m1, g1) = out
    assert torch.equal(l0, l1) and torch.equal(g0, g1)
    assert m0.keys() == m1.keys() and all(torch.equal(m0[k], m1[k]) for k in m0)


def test_weights_of_the_wrong_shape_are_refused():
    theta, prox, _, adv, mask = tensors()
    with pytest.raises(ValueError, match='behaviour_weights must have shape'):
        PPOClipLoss()(theta, prox, adv, mask, behaviour_weights=torch.ones(2, 2))


@pytest.mark.parametrize('mode, cap, match', [
    ('clip', 2.0, "behaviour_correction must be one of \\['none', 'truncate', 'mask', "
     "'sequence_truncate', 'sequence_mask', 'geometric_truncate', 'geometric_mask'\\]"),
    ('truncate', 1.0, 'behaviour_cap must be a real number in \\(1.0, inf\\)'),
    ('mask', math.inf, 'behaviour_cap'), ('none', math.nan, 'behaviour_cap'),
    ('mask', True, 'behaviour_cap')])
def test_bad_modes_and_caps_are_refused(mode, cap, match):
    _, prox, mu, _, mask = tensors()
    with pytest.raises(ValueError, match=match):
        BehaviourCorrection.of(prox, mu, mask, mode, cap)
