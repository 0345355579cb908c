"""Tests for ClipCovLoss and KLCovLoss against plain-Python references."""

import itertools
import math

import pytest
import torch

from .cases import random_case, to_tensors
from gepo_xtuner.loss import ClipCovLoss, KLCovLoss

AGGS = ('token-mean', 'seq-mean-token-mean')


class Token:
    """One valid token of a case, with everything the references need."""

    def __init__(self, i, t, lp, old, adv):
        self.i, self.t, self.lp = i, t, lp
        self.a = adv[i][t] if isinstance(adv[i], list) else adv[i]
        self.log_ratio = lp - old
        self.rho = math.exp(lp - old)


def valid_tokens(lp, old, adv, mask):
    tokens = [Token(i, t, lp[i][t], old[i][t], adv) for i in range(len(lp))
              for t in range(len(lp[i])) if mask[i][t]]
    if tokens:
        mean_a = sum(tok.a for tok in tokens) / len(tokens)
        mean_lp = sum(tok.lp for tok in tokens) / len(tokens)
        for tok in tokens:
            tok.cov = (tok.a - mean_a) * (tok.lp - mean_lp)
    return tokens


def weight(tok, mask, agg):
    if agg == 'token-mean':
        return 1.0 / sum(map(sum, mask))
    return 1.0 / (sum(mask[tok.i]) * sum(1 for row in mask if any(row)))


def base_term(tok, importance, clip_low=None, clip_high=None, eps_low=1.0, eps_high=4.0):
    """(value, d value / d lp, clipped) of the base surrogate; clip_low=None: no clip."""
    if importance == 'cispo':
        w = min(max(tok.rho, max(0.0, 1 - eps_low)), 1 + eps_high)
        return -w * tok.a * tok.lp, -w * tok.a, w != tok.rho
    l1 = -tok.a * tok.rho
    if clip_low is None:
        return l1, l1, False
    l2 = -tok.a * min(max(tok.rho, 1 - clip_low), 1 + clip_high)
    return (l2, 0.0, True) if l2 > l1 else (l1, l1, False)


def collect(tokens, shape, mask, agg, per_token):
    """Aggregate per-token (value, grad) pairs into (loss, grad nested list)."""
    loss, grad = 0.0, [[0.0] * shape[1] for _ in range(shape[0])]
    for tok in tokens:
        value, dvalue = per_token(tok)
        w = weight(tok, mask, agg)
        loss += w * value
        grad[tok.i][tok.t] = w * dvalue
    return loss, grad


# ----------------------------------------------------------------------------- Clip-Cov
CLIP_COV_CONFIGS = [
    dict(importance='ratio', clip_low=0.2, clip_high=0.2),
    dict(importance='ratio', clip_low=1.0, clip_high=1.0),
    dict(importance='cispo', eps_low=1.0, eps_high=0.3),
]


@pytest.mark.parametrize('agg', AGGS)
@pytest.mark.parametrize('seed', range(20))
@pytest.mark.parametrize('ratio', [1e-6, 0.25, 1.0])
@pytest.mark.parametrize('cfg', CLIP_COV_CONFIGS)
def test_clip_cov_matches_one_valid_selection(seed, agg, ratio, cfg):
    lp, old, adv, mask = random_case(2000 + seed, adv_scale=1.5)
    lp_t, old_t, adv_t, mask_t = to_tensors(lp, old, adv, mask)
    fn = ClipCovLoss(clip_cov_ratio=ratio, clip_cov_lb=0.1, clip_cov_ub=1.5, agg=agg,
                     seed=seed, **cfg)
    loss, metrics = fn(lp_t, old_t, adv_t, mask_t)
    loss.backward()

    tokens = valid_tokens(lp, old, adv, mask)
    imp = cfg['importance']
    clip = (cfg.get('clip_low'), cfg.get('clip_high'))
    eps = (cfg.get('eps_low', 1.0), cfg.get('eps_high', 4.0))
    terms = {id(tok): base_term(tok, imp, *clip, *eps) for tok in tokens}
    cands = [tok for tok in tokens if 0.1 < tok.cov < 1.5
             and not (imp == 'ratio' and terms[id(tok)][2])]
    n = max(1, math.floor(ratio * len(tokens)))  # the authors' count
    size = min(n, len(cands))
    matches = 0
    for chosen in itertools.combinations([id(tok) for tok in cands], size):
        ref_loss, ref_grad = collect(
            tokens, lp_t.shape, mask, agg,
            lambda tok: (0.0, 0.0) if id(tok) in chosen else terms[id(tok)][:2])
        ref_grad = torch.tensor(ref_grad, dtype=torch.float64)
        if (abs(loss.item() - ref_loss) <= 1e-6 * max(1.0, abs(ref_loss))
                and torch.allclose(lp_t.grad, ref_grad, atol=1e-6, rtol=1e-6)):
            matches += 1
    assert matches >= 1
    assert metrics['loss/cov_tokens'].item() == size
    assert metrics['loss/cov_frac'].item() == pytest.approx(size / max(len(tokens), 1))
    clipped = sum(terms[id(tok)][2] for tok in tokens)
    assert metrics['loss/clipfrac'].item() == pytest.approx(clipped / max(len(tokens), 1))


def constructed_batch():
    """Row 0 (valid): adv_c = [3, 3, -1 x6], lp_c = [1, 1, -.5 x4, 0, 0] -> cov =
    [3, 3, .5, .5, .5, .5, 0, 0]: only tokens 0 and 1 lie in (1, 5). Row 1 is padding
    with extreme values that would change the means if they were used."""
    adv = torch.tensor([[3.0, 3.0] + [-1.0] * 6, [50.0] * 8], dtype=torch.float64)
    lp = torch.tensor([[0.0, 0.0] + [-1.5] * 4 + [-1.0, -1.0], [-30.0] * 8],
                      dtype=torch.float64) - 1.0
    mask = torch.tensor([[True] * 8, [False] * 8])
    return lp, adv, mask


def run(fn, lp, old, adv, mask):
    x = lp.clone().requires_grad_()
    loss, metrics = fn(x, old, adv, mask)
    loss.backward()
    return loss, metrics, x.grad


def test_clip_cov_detaches_exactly_the_known_candidates():
    lp, adv, mask = constructed_batch()
    loss, metrics, grad = run(ClipCovLoss(clip_cov_ratio=1.0), lp, lp, adv, mask)
    expected = torch.where(mask, -adv / 8, torch.zeros_like(adv))  # rho = 1
    expected[0, :2] = 0.0
    torch.testing.assert_close(grad, expected)
    assert metrics['loss/cov_tokens'].item() == 2.0
    assert metrics['loss/cov_frac'].item() == pytest.approx(2 / 8)
    assert loss.item() == pytest.approx(-adv[0, 2:].sum().item() / 8)


def test_clip_cov_excludes_ppo_clipped_tokens_in_ratio_mode_only():
    lp, adv, mask = constructed_batch()
    old = lp.clone()
    old[0, 1] -= math.log(3.0)  # rho = 3 with A = 3 > 0: PPO-clipped (clip 0.2)
    _, metrics, grad = run(ClipCovLoss(clip_cov_ratio=1.0, clip_low=0.2, clip_high=0.2),
                           lp, old, adv, mask)
    assert metrics['loss/cov_tokens'].item() == 1.0
    assert grad[0, 0].item() == 0.0 and grad[0, 1].item() == 0.0  # detached / clipped
    assert metrics['loss/clipfrac'].item() == pytest.approx(1 / 8)
    _, metrics, grad = run(ClipCovLoss(clip_cov_ratio=1.0, importance='cispo'),
                           lp, old, adv, mask)
    assert metrics['loss/cov_tokens'].item() == 2.0


def test_clip_cov_selects_one_when_ratio_rounds_to_zero_and_is_reproducible():
    lp, adv, mask = constructed_batch()
    chosen = []
    for seed in range(20):
        grads = [run(ClipCovLoss(clip_cov_ratio=1e-4, seed=seed), lp, lp, adv, mask)
                 for _ in range(2)]
        assert all(m['loss/cov_tokens'].item() == 1.0 for _, m, _ in grads)
        assert torch.equal(grads[0][2], grads[1][2])  # same seed, same selection
        zero = (grads[0][2][0, :2] == 0).tolist()
        assert sum(zero) == 1 and (grads[0][2][0, 2:] != 0).all()
        chosen.append(zero.index(True))
    assert set(chosen) == {0, 1}  # uniform choice: both candidates get picked


def test_clip_cov_global_rng_when_seed_is_none():
    lp, adv, mask = constructed_batch()
    fn = ClipCovLoss(clip_cov_ratio=1e-4)
    grads = []
    for _ in range(2):
        torch.manual_seed(123)
        grads.append(run(fn, lp, lp, adv, mask)[2])
    assert torch.equal(grads[0], grads[1])


def test_clip_cov_no_candidate_selects_nothing():
    lp, adv, mask = constructed_batch()
    loss, metrics, grad = run(ClipCovLoss(clip_cov_lb=10.0, clip_cov_ub=20.0),
                              lp, lp, adv, mask)
    assert metrics['loss/cov_tokens'].item() == 0.0
    torch.testing.assert_close(grad, torch.where(mask, -adv / 8, torch.zeros_like(adv)))


# ------------------------------------------------------------------------------ KL-Cov
def ref_kl_cov(lp, old, adv, mask, agg, ratio, coef, importance, eps_high):
    tokens = valid_tokens(lp, old, adv, mask)
    order = sorted(range(len(tokens)), key=lambda j: -tokens[j].cov)  # stable
    k = min(len(tokens), max(1, math.floor(ratio * len(tokens)))) if tokens else 0
    top = {id(tokens[j]) for j in order[:k]}

    def per_token(tok):
        value, dvalue, _ = base_term(tok, importance, eps_high=eps_high)
        if id(tok) in top:
            sign = (tok.log_ratio > 0) - (tok.log_ratio < 0)
            value, dvalue = value + coef * abs(tok.log_ratio), dvalue + coef * sign
        return value, dvalue

    loss, grad = collect(tokens, (len(lp), len(lp[0])), mask, agg, per_token)
    penalties = [coef * abs(tok.log_ratio) for tok in tokens if id(tok) in top]
    return loss, grad, k, sum(penalties) / max(k, 1)


@pytest.mark.parametrize('agg', AGGS)
@pytest.mark.parametrize('seed', range(20))
@pytest.mark.parametrize('cfg', [(0.002, 1.0, 'ratio'), (0.25, 0.7, 'ratio'),
                                 (0.5, 2.0, 'cispo'), (1.0, 1.0, 'ratio')])
def test_kl_cov_matches_reference(seed, agg, cfg):
    ratio, coef, importance = cfg
    lp, old, adv, mask = random_case(2000 + seed, adv_scale=1.5)
    lp_t, old_t, adv_t, mask_t = to_tensors(lp, old, adv, mask)
    fn = KLCovLoss(kl_cov_ratio=ratio, ppo_kl_coef=coef, importance=importance,
                   eps_high=0.3, agg=agg)
    loss, metrics = fn(lp_t, old_t, adv_t, mask_t)
    loss.backward()
    ref_loss, ref_grad, k, penalty = ref_kl_cov(lp, old, adv, mask, agg, ratio, coef,
                                                importance, 0.3)
    assert loss.item() == pytest.approx(ref_loss, abs=1e-6, rel=1e-6)
    torch.testing.assert_close(lp_t.grad, torch.tensor(ref_grad, dtype=torch.float64),
                               atol=1e-6, rtol=1e-6)
    assert metrics['loss/cov_tokens'].item() == k
    assert metrics['loss/kl_cov_penalty'].item() == pytest.approx(penalty, abs=1e-9)


def kl_batch():
    """One row, adv_c = [3, 2, -1 x5], lp_c = [1, .5, -.3 x5]: cov = [3, 1, .3 x5]."""
    adv = torch.tensor([[3.0, 2.0] + [-1.0] * 5], dtype=torch.float64)
    lp = torch.tensor([[1.0, 0.5] + [-0.3] * 5], dtype=torch.float64) - 2.0
    old = lp + torch.tensor([[0.1, -0.2, 0.05, -0.05, 0.1, 0.2, -0.1]], dtype=torch.float64)
    return lp, old, adv, torch.ones_like(lp, dtype=torch.bool)


@pytest.mark.parametrize('ratio,top', [(0.01, [0]), (0.2, [0]), (0.3, [0, 1]),
                                       (0.5, [0, 1, 2]), (1.0, list(range(7)))])
def test_kl_cov_penalises_known_top_tokens(ratio, top):
    lp, old, adv, mask = kl_batch()
    loss, metrics, grad = run(KLCovLoss(kl_cov_ratio=ratio, ppo_kl_coef=2.0),
                              lp, old, adv, mask)
    log_ratio = lp - old
    rho = log_ratio.exp()
    selected = torch.zeros_like(mask)
    selected[0, top] = True
    penalty = torch.where(selected, 2.0 * log_ratio.abs(), torch.zeros_like(lp))
    assert loss.item() == pytest.approx(((-adv * rho) + penalty).sum().item() / 7)
    expected = (-adv * rho + torch.where(selected, 2.0 * log_ratio.sign(),
                                         torch.zeros_like(lp))) / 7
    torch.testing.assert_close(grad, expected)
    assert metrics['loss/cov_tokens'].item() == len(top)  # floor(7 * ratio), >= 1
    assert metrics['loss/cov_frac'].item() == pytest.approx(len(top) / 7)
    assert metrics['loss/kl_cov_penalty'].item() == pytest.approx(
        penalty.sum().item() / len(top))


@pytest.mark.parametrize('fn', [ClipCovLoss(clip_cov_ratio=1.0, seed=0),
                                KLCovLoss(), KLCovLoss(importance='cispo')])
@pytest.mark.parametrize('agg_mask', [torch.zeros(2, 3), torch.zeros(0, 3)])
def test_empty_mask_gives_zero(fn, agg_mask):
    lp = torch.randn(agg_mask.shape, requires_grad=True)
    loss, metrics = fn(lp, torch.randn(agg_mask.shape), torch.randn(agg_mask.shape[0]),
                       agg_mask)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros_like(lp))
    assert metrics['loss/cov_tokens'].item() == 0.0
    assert all(torch.isfinite(v) for v in metrics.values())


def test_covariance_is_degenerate_over_one_response_and_real_over_several():
    gen = torch.Generator().manual_seed(0)
    lp = -torch.rand(4, 50, generator=gen, dtype=torch.float64) * 6
    adv = torch.tensor([1.5, -0.5, -0.5, -0.5], dtype=torch.float64)
    mask = torch.ones_like(lp, dtype=torch.bool)
    for fn in (ClipCovLoss(clip_cov_ratio=0.05, seed=0), KLCovLoss()):
        _, one = fn(lp[:1], lp[:1], adv[:1], mask[:1])  # a micro-batch of one response
        _, many = fn(lp, lp, adv, mask)
        assert one['loss/cov_abs_mean'].item() == 0.0
        assert many['loss/cov_abs_mean'].item() > 0.5
    _, one = ClipCovLoss(clip_cov_ratio=0.05, seed=0)(lp[:1], lp[:1], adv[:1], mask[:1])
    assert one['loss/cov_tokens'].item() == 0  # nothing in (lb, ub): GRPO + CISPO in disguise
    _, many = ClipCovLoss(clip_cov_ratio=0.05, seed=0)(lp, lp, adv, mask)
    assert many['loss/cov_tokens'].item() == 10  # floor(0.05 * 200)
