"""The reference-KL estimator: exact expectation, sign, and reduction."""

import pytest
import torch

from gepo_xtuner.loss import aggregate, kl_k3, reference_kl_loss


@pytest.mark.parametrize('seed', range(5))
def test_k3_is_unbiased_for_the_kl_under_the_policy(seed):
    gen = torch.Generator().manual_seed(seed)
    logits, ref_logits = torch.randn(2, 50, generator=gen) * 2
    lp, ref = logits.log_softmax(-1), ref_logits.log_softmax(-1)
    exact = (lp.exp() * (lp - ref)).sum()  # KL(pi || pi_ref)
    # expectation of k3 over y ~ pi, taken exactly over the vocabulary
    expected = (lp.exp() * kl_k3(lp, ref)).sum()
    torch.testing.assert_close(expected, exact, rtol=1e-5, atol=1e-6)


def test_k3_is_nonnegative_and_zero_only_at_equality():
    lp = torch.randn(4, 7)
    ref = torch.randn(4, 7)
    assert (kl_k3(lp, ref) >= 0).all()
    assert kl_k3(lp, lp).abs().max() == 0


def test_gradient_pulls_the_policy_towards_the_reference():
    lp = torch.tensor([[-1.0, -3.0]], requires_grad=True)
    ref = torch.tensor([[-2.0, -2.0]])
    reference_kl_loss(lp, ref, torch.ones(1, 2, dtype=torch.bool), 'token-mean').backward()
    # descending the loss lowers a logprob above the reference and raises one below it
    assert lp.grad[0, 0] > 0 and lp.grad[0, 1] < 0


def test_padding_is_ignored_and_reduction_matches_aggregate():
    lp = torch.log(torch.tensor([[0.5, 0.2, 1.0], [0.1, 1.0, 1.0]]))
    ref = torch.log(torch.tensor([[0.4, 0.3, 1e-30], [0.2, 1e-30, 1e-30]]))
    mask = torch.tensor([[True, True, False], [True, False, False]])
    for agg in ('token-mean', 'seq-mean-token-mean'):
        got = reference_kl_loss(lp, ref, mask, agg)
        want = aggregate(torch.where(mask, kl_k3(lp, ref), 0), mask, agg)
        torch.testing.assert_close(got, want)
        assert torch.isfinite(got)
