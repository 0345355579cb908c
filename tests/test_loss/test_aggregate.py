"""Tests for gepo_xtuner.loss.aggregate against plain-Python references."""

import math
import random

import pytest
import torch

from gepo_xtuner.loss.aggregate import AGG_MODES, aggregate, masked_mean


def random_batch(seed):
    """Random (N, T) per-token values and a mask with at least one empty row if N > 1."""
    rng = random.Random(seed)
    n, t = rng.randint(1, 5), rng.randint(1, 7)
    values = [[rng.uniform(-3.0, 3.0) for _ in range(t)] for _ in range(n)]
    mask = [[rng.random() < 0.7 for _ in range(t)] for _ in range(n)]
    if n > 1:
        mask[rng.randrange(n)] = [False] * t
    return values, mask


def ref_aggregate(values, mask, mode, num_tokens=None, num_seqs=None):
    """Loop reference; returns (loss, d loss / d value_it as nested lists)."""
    weights = [[0.0] * len(row) for row in values]
    if mode == 'token-mean':
        denom = num_tokens if num_tokens is not None else sum(map(sum, mask))
        for i, row in enumerate(mask):
            for t, m in enumerate(row):
                if m:
                    weights[i][t] = 1.0 / max(denom, 1)
    elif mode == 'seq-mean-token-sum-norm':  # Dr.GRPO: constant length L = T
        n_seqs = num_seqs if num_seqs is not None else sum(1 for row in mask if any(row))
        for i, row in enumerate(mask):
            for t, m in enumerate(row):
                if m:
                    weights[i][t] = 1.0 / (max(n_seqs, 1) * len(row))
    else:
        n_seqs = num_seqs if num_seqs is not None else sum(1 for row in mask if any(row))
        for i, row in enumerate(mask):
            count = sum(row)
            for t, m in enumerate(row):
                if m:
                    weights[i][t] = 1.0 / (count * max(n_seqs, 1))
    loss = math.fsum(w * v for wr, vr in zip(weights, values) for w, v in zip(wr, vr))
    return loss, weights


@pytest.mark.parametrize('mode', AGG_MODES)
@pytest.mark.parametrize('seed', range(20))
def test_matches_reference(mode, seed):
    values, mask = random_batch(seed)
    x = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    m = torch.tensor(mask)
    # Garbage at padded positions must not leak into value or gradient.
    garbage = torch.where(m, torch.zeros_like(x), torch.full_like(x, math.nan))
    loss = aggregate(x + garbage, m, mode)
    loss.backward()
    ref_loss, ref_grad = ref_aggregate(values, mask, mode)
    assert loss.dim() == 0
    assert loss.item() == pytest.approx(ref_loss, abs=1e-9)
    torch.testing.assert_close(x.grad, torch.tensor(ref_grad, dtype=torch.float64),
                               atol=1e-9, rtol=0)


@pytest.mark.parametrize('seed', range(10))
def test_float_mask_equals_bool_mask(seed):
    values, mask = random_batch(seed)
    x = torch.tensor(values)
    m = torch.tensor(mask)
    for mode in AGG_MODES:
        assert torch.equal(aggregate(x, m, mode), aggregate(x, m.float(), mode))


def test_num_tokens_override_reproduces_minibatch_mean():
    torch.manual_seed(0)
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    m = torch.rand(6, 5) < 0.6
    m[0, 0] = True
    full = aggregate(x, m, 'token-mean')
    total = m.sum()
    micro = [aggregate(x[i:i + 2], m[i:i + 2], 'token-mean', num_tokens=total)
             for i in (0, 2, 4)]
    assert torch.allclose(sum(micro), full, atol=1e-12)
    # A Python number works too and matches the reference denominator.
    ref, _ = ref_aggregate(x.tolist(), m.tolist(), 'token-mean', num_tokens=37)
    got = aggregate(x, m, 'token-mean', num_tokens=37)
    assert got.item() == pytest.approx(ref, abs=1e-12)


def test_num_seqs_override_reproduces_minibatch_mean():
    torch.manual_seed(1)
    x = torch.randn(4, 6, dtype=torch.float64)
    m = torch.rand(4, 6) < 0.5
    m[:, 0] = True
    m[3] = False
    full = aggregate(x, m, 'seq-mean-token-mean')
    n_seqs = m.any(-1).sum()
    micro = [aggregate(x[i:i + 2], m[i:i + 2], 'seq-mean-token-mean', num_seqs=n_seqs)
             for i in (0, 2)]
    assert torch.allclose(sum(micro), full, atol=1e-12)
    ref, _ = ref_aggregate(x.tolist(), m.tolist(), 'seq-mean-token-mean', num_seqs=7)
    got = aggregate(x, m, 'seq-mean-token-mean', num_seqs=7.0)
    assert got.item() == pytest.approx(ref, abs=1e-12)


@pytest.mark.parametrize('mode', AGG_MODES)
@pytest.mark.parametrize('override', [None, 0, torch.tensor(0.0)])
def test_empty_mask_is_zero_and_backward_works(mode, override):
    x = torch.randn(3, 4, requires_grad=True)
    m = torch.zeros(3, 4, dtype=torch.bool)
    kwargs = {'num_tokens' if mode == 'token-mean' else 'num_seqs': override}
    loss = aggregate(x * 1e30, m, mode, **kwargs)
    assert loss.item() == 0.0
    assert loss.requires_grad
    loss.backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_token_sum_norm_uses_the_constant_length_not_the_padded_width():
    x, m = torch.randn(4, 6), torch.rand(4, 6) < 0.6
    m[0, 0] = True
    wide = torch.cat([x, torch.randn(4, 5)], 1)  # more padding must change nothing
    wide_m = torch.cat([m, torch.zeros(4, 5, dtype=torch.bool)], 1)
    a = aggregate(x, m, 'seq-mean-token-sum-norm', norm_length=32)
    b = aggregate(wide, wide_m, 'seq-mean-token-sum-norm', norm_length=32)
    n_seqs = m.any(1).sum()
    assert a.item() == pytest.approx(b.item())
    assert a.item() == pytest.approx((x[m].sum() / (n_seqs * 32)).item())
    with pytest.raises(ValueError, match='norm_length'):
        aggregate(x, m, 'seq-mean-token-sum-norm', norm_length=0)


def test_bad_mode_lists_valid_modes():
    with pytest.raises(ValueError, match="token-mean.*seq-mean-token-mean"):
        aggregate(torch.zeros(2, 2), torch.ones(2, 2), 'seq-mean')


def test_bad_shapes_and_negative_override():
    with pytest.raises(ValueError, match='shape'):
        aggregate(torch.zeros(2, 3), torch.ones(2, 2), 'token-mean')
    with pytest.raises(ValueError, match='num_tokens'):
        aggregate(torch.zeros(2, 2), torch.ones(2, 2), 'token-mean', num_tokens=-1)


def test_masked_mean():
    x = torch.tensor([[1.0, 2.0, math.inf], [4.0, math.nan, 6.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 1]], dtype=torch.float32)
    assert masked_mean(x, m).item() == pytest.approx((1 + 2 + 4 + 6) / 4)
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0
