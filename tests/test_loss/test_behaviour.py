"""Behaviour correction of the policy losses (stale rollouts: mu behind pi_prox).

A hand-computed 2-row case: probabilities chosen so that every ratio and weight is a
simple number, the expected loss written out token by token for each mode.
"""

import math

import pytest
import torch

from gepo_xtuner.loss import (BEHAVIOUR_CORRECTIONS, BehaviourCorrection, PPOClipLoss,
                             behaviour_weights)
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


# -- sequence-level modes and the veto -----------------------------------------------------
# On the hand case: row 0 w = [2, 1, 0.5] -> W^seq = 1, W^geo = 1;
#                   row 1 w = [4, 1]      -> W^seq = 4, W^geo = 4^(1/2) = 2.
# Per-token losses: row 0 [-1.0, -1.2, -0.75] (sum -2.95), row 1 [1.6, 3.0] (sum 4.6).


@pytest.mark.parametrize('mode, cap, veto, expected, kept', [
    # min(W, 3) = [1, 3]: (-2.95 + 3 * 4.6) / 5 tokens
    ('sequence_truncate', 3.0, None, (-2.95 + 3 * 4.6) / 5, None),
    # W^seq = 4 outside [1/3, 3]: row 1 leaves; -2.95 / 3 kept tokens
    ('sequence_mask', 3.0, None, -2.95 / 3, [[True] * 3, [False] * 3]),
    # min(W^geo, 3) = [1, 2]
    ('geometric_truncate', 3.0, None, (-2.95 + 2 * 4.6) / 5, None),
    # W^geo = 2 inside [1/3, 3]: everything kept (where W^seq = 4 was not)
    ('geometric_mask', 3.0, None, 1.65 / 5, [[True] * 3, [True, True, False]]),
    # W^geo = 2 outside [1/1.5, 1.5]
    ('geometric_mask', 1.5, None, -2.95 / 3, [[True] * 3, [False] * 3]),
    # veto 0.6: row 0 holds w = 0.5 < 0.6 and leaves whole; no weights with 'none'
    ('none', 2.0, 0.6, 4.6 / 2, [[False] * 3, [True, True, False]]),
    # truncate and veto: row 1 alone, min(w, 3) = [3, 1]: (3 * 1.6 + 3.0) / 2 tokens
    ('truncate', 3.0, 0.6, (3 * 1.6 + 3.0) / 2, [[False] * 3, [True, True, False]]),
    # veto 0.4: no token below it; sequence_mask drops row 1 as above
    ('sequence_mask', 3.0, 0.4, -2.95 / 3, [[True] * 3, [False] * 3]),
])
def test_sequence_modes_and_veto_by_hand(mode, cap, veto, expected, kept):
    theta, prox, rollout, adv, mask = tensors()
    corr = BehaviourCorrection.of(prox, rollout, mask, mode, cap, veto)
    counted = mask if corr.loss_mask is None else corr.loss_mask
    loss, _ = PPOClipLoss()(theta, prox, adv, counted, num_tokens=counted.sum().double(),
                            num_seqs=counted.any(1).sum().double(),
                            behaviour_weights=corr.loss_weights)
    assert loss.item() == pytest.approx(expected)
    assert (corr.loss_mask is None) == (kept is None)
    if kept is not None:
        assert corr.loss_mask.tolist() == kept


def test_sequence_metrics_by_hand():
    _, prox, rollout, _, mask = tensors()
    corr = BehaviourCorrection.of(prox, rollout, mask, 'sequence_truncate', 3.0)
    assert corr.metrics(corr.mode, *corr.metric_sums(), corr.veto) == pytest.approx({
        'offpolicy/weight_mean': 1.7, 'offpolicy/weight_max': 4.0,
        'offpolicy/seq_weight_mean': 2.5, 'offpolicy/seq_weight_max': 4.0,
        'offpolicy/frac_seq_truncated': 0.5})
    corr = BehaviourCorrection.of(prox, rollout, mask, 'geometric_mask', 1.5, veto=0.6)
    assert corr.metrics(corr.mode, *corr.metric_sums(), corr.veto) == pytest.approx({
        'offpolicy/weight_mean': 1.7, 'offpolicy/weight_max': 4.0,
        'offpolicy/seq_weight_mean': 1.5, 'offpolicy/seq_weight_max': 2.0,
        'offpolicy/frac_seq_masked': 0.5, 'offpolicy/frac_vetoed': 0.5})
    corr = BehaviourCorrection.of(prox, rollout, mask, 'none', 2.0, veto=0.6)
    assert corr.loss_weights is None
    assert corr.metrics(corr.mode, *corr.metric_sums(), corr.veto) == pytest.approx({
        'offpolicy/weight_mean': 1.7, 'offpolicy/weight_max': 4.0,
        'offpolicy/frac_vetoed': 0.5})
    # rows 1 only: its one response
    sums, top = corr.metric_sums(torch.tensor([1]))
    assert corr.metrics(corr.mode, sums, top, corr.veto)['offpolicy/frac_vetoed'] == 0.0


def loop_reference(prox, rollout, adv, theta, mask, mode, cap, veto, agg, clip=0.2):
    """Per-token weights, kept tokens and the PPO-clip loss of one batch, written as plain
    Python loops over responses and tokens from the formulas of the modes."""
    rows, width = len(mask), len(mask[0])
    weights = [[1.0] * width for _ in range(rows)]
    kept = [[bool(mask[i][t]) for t in range(width)] for i in range(rows)]
    level, _, action = mode.rpartition('_')
    level = level or 'token'
    for i in range(rows):
        valid = [t for t in range(width) if mask[i][t]]
        d = {t: prox[i][t] - rollout[i][t] for t in valid}
        if veto is not None and any(d[t] < math.log(veto) for t in valid):
            for t in valid:
                kept[i][t] = False
        if mode == 'none':
            continue
        if level == 'token':
            ratios = {t: math.exp(min(max(d[t], -20.0), 20.0)) for t in valid}
        else:
            total = sum(d.values())
            if level == 'geometric' and valid:
                total /= len(valid)
            big = math.exp(min(max(total, -20.0), 20.0))
            ratios = {t: big for t in valid}
        for t in valid:
            if action == 'truncate':
                weights[i][t] = min(ratios[t], cap)
            elif not 1.0 / cap <= ratios[t] <= cap:
                kept[i][t] = False
    # PPO clip per token, then the aggregation over the kept tokens
    terms = [[0.0] * width for _ in range(rows)]
    for i in range(rows):
        for t in range(width):
            if kept[i][t]:
                r = math.exp(theta[i][t] - prox[i][t])
                loss = max(-adv[i] * r, -adv[i] * min(max(r, 1 - clip), 1 + clip))
                terms[i][t] = weights[i][t] * loss
    if agg == 'token-mean':
        n = sum(sum(row) for row in kept)
        value = sum(sum(row) for row in terms) / max(n, 1)
    else:
        means = [sum(terms[i]) / sum(kept[i]) for i in range(rows) if any(kept[i])]
        value = sum(means) / max(len(means), 1)
    return weights, kept, value


MODES_AND_VETO = [(mode, veto) for mode in BEHAVIOUR_CORRECTIONS for veto in (None, 0.5)
                  if (mode, veto) != ('none', None)]


@pytest.mark.parametrize('agg', ['token-mean', 'seq-mean-token-mean'])
@pytest.mark.parametrize('mode, veto', MODES_AND_VETO)
@pytest.mark.parametrize('seed', range(4))
def test_every_mode_matches_a_loop_reference(seed, mode, veto, agg):
    """Random batches (empty rows, long rows, padding holding junk): weights, kept tokens
    and the loss of the vectorised correction against :func:`loop_reference`."""
    gen = torch.Generator().manual_seed(seed)
    n, width = 9, 11
    lengths = torch.randint(0, width + 1, (n, ), generator=gen)
    lengths[0], lengths[1] = 0, width  # one empty response, one full-width one
    mask = torch.arange(width)[None, :] < lengths[:, None]
    rollout = -torch.rand(n, width, generator=gen, dtype=torch.float64) * 3
    # log-ratios mostly small, a few large (some below log 0.5, some sums outside the band)
    spread = torch.where(torch.rand(n, width, generator=gen) < 0.1, 1.5, 0.25)
    prox = rollout + spread * torch.randn(n, width, generator=gen, dtype=torch.float64)
    theta = prox + 0.3 * torch.randn(n, width, generator=gen, dtype=torch.float64)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    junk = ~mask
    prox, rollout = prox.masked_fill(junk, math.nan), rollout.masked_fill(junk, 50.0)
    # a narrower band for the geometric mean, which averages the spread away
    cap = 1.15 if mode.startswith('geometric') else 1.6
    corr = BehaviourCorrection.of(prox, rollout, mask, mode, cap, veto)
    weights, kept, expected = loop_reference(
        prox.tolist(), rollout.tolist(), adv.tolist(), theta.tolist(), mask.tolist(), mode,
        cap, veto, agg)
    got_weights = torch.ones(n, width, dtype=torch.float64) if corr.loss_weights is None \
        else torch.where(mask, corr.loss_weights, 1.0)
    torch.testing.assert_close(got_weights, torch.tensor(weights, dtype=torch.float64))
    counted = mask if corr.loss_mask is None else corr.loss_mask
    assert counted.tolist() == kept
    theta = theta.masked_fill(junk, 0.0).requires_grad_()
    loss, _ = PPOClipLoss(agg=agg)(theta, prox.masked_fill(junk, 0.0), adv, counted,
                                   num_tokens=counted.sum().double(),
                                   num_seqs=counted.any(1).sum().double(),
                                   behaviour_weights=corr.loss_weights)
    assert loss.item() == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # the figures logged: the loop's w, W and shares
    sums, top = corr.metric_sums()
    metrics = corr.metrics(mode, sums, top, veto)
    present = [i for i in range(n) if lengths[i] > 0]
    d = (prox - rollout).masked_fill(junk, 0.0)
    w = torch.exp(d.clamp(-20, 20))[mask]
    assert metrics['offpolicy/weight_mean'] == pytest.approx(float(w.mean()))
    if veto is not None:
        vetoed = [i for i in present if any(d[i, t] < math.log(veto) for t in range(lengths[i]))]
        assert metrics['offpolicy/frac_vetoed'] == pytest.approx(len(vetoed) / len(present))
    if mode.startswith(('sequence', 'geometric')):
        big = [math.exp(float(d[i].sum()) / (int(lengths[i]) if mode.startswith('geo') else 1))
               for i in present]
        assert metrics['offpolicy/seq_weight_mean'] == pytest.approx(sum(big) / len(big))
        assert metrics['offpolicy/seq_weight_max'] == pytest.approx(max(big))
        out = [b for b in big if (b > cap if mode.endswith('truncate') else
                                  not 1 / cap <= b <= cap)]
        key = 'truncated' if mode.endswith('truncate') else 'masked'
        assert metrics[f'offpolicy/frac_seq_{key}'] == pytest.approx(len(out) / len(present))


@pytest.mark.parametrize('mode', BEHAVIOUR_CORRECTIONS)
def test_equal_logprobs_change_nothing_in_any_mode(mode):
    """``mu = pi_prox``: every weight exactly 1, nothing dropped, the veto silent."""
    _, prox, _, _, mask = tensors()
    corr = BehaviourCorrection.of(prox, prox.clone(), mask, mode, 1.0001, veto=0.9999)
    assert corr.loss_weights is None or torch.equal(corr.loss_weights, torch.ones_like(prox))
    assert torch.equal(corr.loss_mask, mask) and not corr.vetoed.any()
    if corr.seq_weights is not None:
        assert torch.equal(corr.seq_weights, torch.ones(2, dtype=torch.float64))


@pytest.mark.parametrize('veto', [0.0, 1.0, -0.5, 2.0, math.nan, True])
def test_bad_vetoes_are_refused(veto):
    _, prox, mu, _, mask = tensors()
    with pytest.raises(ValueError, match=r'train_cfg.behaviour_veto must be a real number in '
                                         r'\(0.0, 1.0\)'):
        BehaviourCorrection.of(prox, mu, mask, 'none', 2.0, veto)


def test_none_without_a_veto_computes_nothing():
    _, prox, mu, _, mask = tensors()
    assert BehaviourCorrection.of(prox, mu, mask, 'none', 2.0, None) is None
