import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from gepo_xtuner.ops.token import (gather_logprobs, masked_sampled_entropy, token_entropy,
                                   token_nll)


def _ref_logprobs(logits, labels, temperature=1.0, ignore_index=-100):
    ignore = torch.zeros_like(labels, dtype=torch.bool) if ignore_index is None \
        else labels == ignore_index
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    out = logp.gather(-1, labels.masked_fill(ignore, 0)[..., None]).squeeze(-1)
    return out.masked_fill(ignore, 0.0)


def _ref_entropy(logits, temperature=1.0):
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)


def _inputs(shape, vocab, seed=0, ignore_frac=0.2):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, vocab, generator=g) * 3
    labels = torch.randint(0, vocab, shape, generator=g)
    labels[torch.rand(shape, generator=g) < ignore_frac] = -100
    return logits, labels


@pytest.mark.parametrize('shape', [(2, 7), (13,), (3, 1), (1, 32)])
@pytest.mark.parametrize('temperature', [1.0, 0.6, 1.7])
@pytest.mark.parametrize('chunk_size', [1, 3, 4, 1024])
def test_gather_logprobs_matches_reference(shape, temperature, chunk_size):
    logits, labels = _inputs(shape, vocab=50)
    out = gather_logprobs(logits, labels, temperature=temperature, chunk_size=chunk_size)
    ref = _ref_logprobs(logits, labels, temperature)
    assert out.shape == labels.shape and out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    assert (out[labels == -100] == 0).all()
    assert (out[labels != -100] < 0).all()
    nll = token_nll(logits, labels, temperature=temperature, chunk_size=chunk_size)
    torch.testing.assert_close(nll, -ref, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize('temperature,chunk_size', [(1.0, 1), (0.8, 5), (1.3, 64)])
def test_gather_logprobs_gradient(temperature, chunk_size):
    logits, labels = _inputs((3, 9), vocab=40, seed=1)
    weights = torch.randn(3, 9)
    x = logits.clone().requires_grad_()
    (gather_logprobs(x, labels, temperature=temperature, chunk_size=chunk_size) * weights).sum().backward()
    x_ref = logits.clone().requires_grad_()
    (_ref_logprobs(x_ref, labels, temperature) * weights).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-6, rtol=1e-5)
    assert (x.grad[labels == -100] == 0).all()


def test_gradcheck_float64():
    logits, labels = _inputs((2, 5), vocab=7, seed=2)
    x = logits.double().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a: gather_logprobs(a, labels, temperature=0.7, chunk_size=3), (x,))
    assert torch.autograd.gradcheck(lambda a: token_entropy(a, temperature=0.7, chunk_size=3), (x,))


def test_ignore_index_none_and_custom():
    logits, labels = _inputs((4, 6), vocab=10, ignore_frac=0.0)
    out = gather_logprobs(logits, labels, ignore_index=None)
    torch.testing.assert_close(out, _ref_logprobs(logits, labels, ignore_index=None))
    labels[0, 0] = 3
    out = gather_logprobs(logits, labels, ignore_index=3)
    assert (out[labels == 3] == 0).all() and (out[labels != 3] < 0).all()
    with pytest.raises((IndexError, RuntimeError)):  # -100 is out of range without ignore_index
        gather_logprobs(logits, torch.full_like(labels, -100), ignore_index=None)


def test_strided_and_4d_inputs():
    logits, labels = _inputs((3, 10), vocab=30, seed=5)
    x = logits.clone().requires_grad_()
    shifted, shifted_labels = x[:, :-1], labels[:, 1:]  # not flattenable without a copy
    out = gather_logprobs(shifted, shifted_labels, temperature=0.9, chunk_size=4)
    ent = token_entropy(shifted, chunk_size=4)
    x_ref = logits.clone().requires_grad_()
    ref = _ref_logprobs(x_ref[:, :-1], shifted_labels, 0.9)
    ref_ent = _ref_entropy(x_ref[:, :-1])
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    (out.sum() + ent.sum()).backward()
    (ref.sum() + ref_ent.sum()).backward()
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=1e-5)
    four_d = logits.reshape(3, 2, 5, 30).transpose(0, 1)
    torch.testing.assert_close(gather_logprobs(four_d, labels.reshape(3, 2, 5).transpose(0, 1)),
                               _ref_logprobs(four_d, labels.reshape(3, 2, 5).transpose(0, 1)))
    torch.testing.assert_close(token_entropy(four_d.transpose(-1, -2).transpose(-1, -2)),
                               _ref_entropy(four_d))


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('temp', [1.0, 0.7])
def test_half_precision_inputs(dtype, temp):
    logits, labels = _inputs((4, 16), vocab=300, seed=3)
    low = logits.to(dtype)
    out = gather_logprobs(low, labels, temperature=temp, chunk_size=5)
    assert out.dtype == torch.float32
    # the same (rounded) logits in float32 must match tightly, the originals loosely
    torch.testing.assert_close(out, _ref_logprobs(low.float(), labels, temp), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, _ref_logprobs(logits, labels, temp), atol=0.1, rtol=0.02)
    ent = token_entropy(low, temperature=temp, chunk_size=5)
    assert ent.dtype == torch.float32
    torch.testing.assert_close(ent, _ref_entropy(low.float(), temp), atol=1e-5, rtol=1e-5)
    x = low.clone().requires_grad_()
    gather_logprobs(x, labels, temperature=temp, chunk_size=5).sum().backward()
    x_ref = low.float().requires_grad_()
    _ref_logprobs(x_ref, labels, temp).sum().backward()
    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad.float(), x_ref.grad, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize('temperature,chunk_size', [(1.0, 1), (0.5, 4), (2.0, 100)])
def test_token_entropy_matches_reference(temperature, chunk_size):
    logits, _ = _inputs((3, 11), vocab=64, seed=4)
    x = logits.clone().requires_grad_()
    out = token_entropy(x, temperature=temperature, chunk_size=chunk_size)
    assert out.shape == (3, 11) and out.dtype == torch.float32
    x_ref = logits.clone().requires_grad_()
    ref = _ref_entropy(x_ref, temperature)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    weights = torch.randn(3, 11)
    (out * weights).sum().backward()
    (ref * weights).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=1e-5)


def test_token_entropy_edge_cases():
    vocab = 100
    logits = torch.randn(5, vocab)
    logits[0, 7] += 1e4                       # peaked -> ~0
    logits[1] = 3.0                           # uniform -> log V
    logits[2, :60] = -math.inf                # masked vocab -> entropy of the rest
    logits[3] = -math.inf                     # fully masked -> 0
    logits[4, 0], logits[4, 1:] = 0.0, -math.inf   # one allowed token -> 0
    x = logits.clone().requires_grad_()
    ent = token_entropy(x, chunk_size=2)
    assert torch.isfinite(ent).all()
    assert ent[0].abs() < 1e-6 and ent[3] == 0 and ent[4] == 0
    torch.testing.assert_close(ent[1], torch.tensor(math.log(vocab)))
    torch.testing.assert_close(ent[2], _ref_entropy(logits[2, 60:]), atol=1e-5, rtol=1e-5)
    ent.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert (x.grad[2, :60] == 0).all() and (x.grad[3] == 0).all()
    x_ref = logits[2].clone().requires_grad_()
    _ref_entropy(x_ref).backward()
    torch.testing.assert_close(x.grad[2, 60:], x_ref.grad[60:], atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert token_entropy(logits).grad_fn is None


def test_masked_sampled_entropy():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, float('-inf'), float('nan')],
                             [float('nan')] * 3])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    out = masked_sampled_entropy(logprobs, mask)
    torch.testing.assert_close(out, torch.tensor([1.5, 0.5, 0.0]))
    torch.testing.assert_close(masked_sampled_entropy(logprobs, mask.bool()), out)
    with pytest.raises(ValueError, match='mask shape'):
        masked_sampled_entropy(logprobs, mask[:, :2])
    with pytest.raises(ValueError, match='2-D float'):
        masked_sampled_entropy(logprobs[0], mask[0])


def test_validation_errors():
    logits, labels = _inputs((2, 3), vocab=5)
    with pytest.raises(ValueError, match='labels shape'):
        gather_logprobs(logits, labels[:, :2])
    with pytest.raises(ValueError, match='integer'):
        gather_logprobs(logits, labels.float())
    with pytest.raises(ValueError, match='floating-point'):
        gather_logprobs(labels[..., None].expand(2, 3, 5), labels)
    for fn in (lambda **kw: gather_logprobs(logits, labels, **kw),
               lambda **kw: token_entropy(logits, **kw)):
        for t in (0.0, -1.0, float('nan'), float('inf')):
            with pytest.raises(ValueError, match='temperature'):
                fn(temperature=t)
        for c in (0, -3, 2.5):
            with pytest.raises(ValueError, match='chunk_size'):
                fn(chunk_size=c)
    with pytest.raises(ValueError, match='V > 0'):
        token_entropy(torch.randn(4))


class _FreshAllocations(TorchDispatchMode):
    """Records the byte size of every tensor storage newly created by an aten op."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                self.sizes.append(t.untyped_storage().nbytes())
        return out


@pytest.mark.parametrize('fn', ['logprobs', 'entropy'])
def test_intermediates_are_chunk_bounded(fn):
    rows, vocab, chunk = 256, 1000, 16
    logits, labels = _inputs((4, 64), vocab=vocab)
    chunk_bytes, full_bytes = chunk * vocab * 4, rows * vocab * 4
    call = {'logprobs': lambda x: gather_logprobs(x, labels, temperature=0.9, chunk_size=chunk),
            'entropy': lambda x: token_entropy(x, temperature=0.9, chunk_size=chunk)}[fn]

    with _FreshAllocations() as naive:  # the tracker does see full-size temporaries
        torch.log_softmax(logits / 0.9, dim=-1)
    assert max(naive.sizes) >= full_bytes

    x = logits.clone().requires_grad_()
    strided = torch.cat([logits, logits], dim=1)[:, 1:65]  # (4, 64, V), not flattenable
    with _FreshAllocations() as fwd:
        out = call(x)
        call(strided)  # no full-size copy either
    assert max(fwd.sizes) <= chunk_bytes
    with _FreshAllocations() as bwd:
        out.sum().backward()
    big = [s for s in bwd.sizes if s > chunk_bytes]
    assert big == [full_bytes]  # only the gradient itself


def test_auto_chunk_size_matches_explicit_chunks():
    from gepo_xtuner.ops.token import CHUNK_ELEMENTS, auto_chunk_size
    logits = torch.randn(3, 50, 1000)
    labels = torch.randint(0, 1000, (3, 50))
    assert auto_chunk_size(logits) == CHUNK_ELEMENTS['cpu'] // 1000
    torch.testing.assert_close(gather_logprobs(logits, labels),
                               gather_logprobs(logits, labels, chunk_size=7))
    torch.testing.assert_close(token_entropy(logits), token_entropy(logits, chunk_size=7))
