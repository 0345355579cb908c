"""Length-aware batching of the in-process ``HFRolloutBackend``, on a real tiny model."""

from dataclasses import replace

import pytest
import torch

from gepo_xtuner.testbed.tiny import EOS_ID, build_char_tokenizer, build_tiny_model
from gepo_xtuner.rollout import RolloutRequest, SamplingParams
from gepo_xtuner.rollout.hf import HFRolloutBackend

LENGTHS = [7, 2, 11, 4, 7, 3]


def requests() -> list[RolloutRequest]:
    return [RolloutRequest(input_ids=[1] + [(5 * i + 3 * t) % 50 + 4 for t in range(n - 1)])
            for i, n in enumerate(LENGTHS)]


def backend(**kwargs) -> HFRolloutBackend:
    tok = build_char_tokenizer()
    rollout = HFRolloutBackend(**kwargs)
    rollout.attach(build_tiny_model(len(tok), seed=1), tok)
    return rollout


def test_plan_orders_by_prompt_length_and_respects_both_caps():
    params = SamplingParams(n=3, max_new_tokens=5)
    rollout = HFRolloutBackend(max_sequences_per_call=4, max_tokens_per_call=60)
    calls = rollout.plan(requests(), params)
    flat = [i for call in calls for i in call]
    assert sorted(flat) == list(range(len(LENGTHS) * 3))  # every row exactly once
    lengths = [LENGTHS[i // 3] for i in flat]
    assert lengths == sorted(lengths)  # shortest prompts first
    for call in calls:
        width = max(LENGTHS[i // 3] for i in call)
        assert len(call) <= 4
        assert len(call) == 1 or len(call) * (width + 5) <= 60
    unsorted = HFRolloutBackend(max_sequences_per_call=4,
                                sort_by_length=False).plan(requests(), params)
    assert [i for call in unsorted for i in call] == list(range(len(LENGTHS) * 3))


def test_results_come_back_in_request_order_whatever_the_batching():
    params = SamplingParams(n=2, max_new_tokens=6, temperature=0.0, stop_token_ids=(EOS_ID, ))
    plain = backend(max_sequences_per_call=256, sort_by_length=False).generate(requests(), params)
    tight = backend(max_sequences_per_call=3, max_tokens_per_call=40).generate(requests(), params)
    assert [[s.response_ids for s in g] for g in plain] == \
        [[s.response_ids for s in g] for g in tight]
    for a, b in zip(plain, tight):
        for x, y in zip(a, b):
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs),
                                       rtol=1e-4, atol=1e-4)


def test_sampling_is_a_function_of_the_global_rng_state():
    params = SamplingParams(n=4, max_new_tokens=6, temperature=1.0, stop_token_ids=(EOS_ID, ))
    rollout = backend(max_sequences_per_call=5, max_tokens_per_call=64)
    torch.manual_seed(0)
    first = rollout.generate(requests(), params)
    torch.manual_seed(0)
    again = rollout.generate(requests(), params)
    assert [[s.response_ids for s in g] for g in first] == \
        [[s.response_ids for s in g] for g in again]


def test_bad_token_cap_is_refused():
    with pytest.raises(ValueError, match='max_tokens_per_call'):
        HFRolloutBackend(max_tokens_per_call=0)


def test_gumbel_max_samples_the_tempered_distribution_exactly():
    """argmax(scores / tau + Gumbel) over 40,000 draws: each token's frequency within
    0.01 of softmax(scores / tau); a suppressed (-inf) token never drawn."""
    from gepo_xtuner.rollout.hf import GumbelSample
    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0, float('-inf')]]).repeat(40_000, 1)
    for tau in (1.0, 0.5):
        picks = GumbelSample(tau, torch.Generator().manual_seed(0))(None, scores).argmax(-1)
        freq = torch.bincount(picks, minlength=5).double() / len(picks)
        expected = torch.softmax(scores[0].double() / tau, -1)
        assert (freq - expected).abs().max() < 0.01, (tau, freq, expected)
        assert freq[4] == 0


def test_seeded_sampling_leaves_the_global_rng_alone_and_repeats():
    """``SamplingParams.seed``: what a generation thread beside the trainer uses."""
    rollout = backend(max_sequences_per_call=5)
    params = SamplingParams(n=4, max_new_tokens=6, temperature=1.0, stop_token_ids=(EOS_ID, ),
                            seed=7)
    state = torch.get_rng_state()
    first = rollout.generate(requests(), params)
    assert torch.equal(torch.get_rng_state(), state)  # nothing drawn from the global stream
    torch.manual_seed(123)  # whatever the global stream holds
    again = rollout.generate(requests(), params)
    ids = [[s.response_ids for s in g] for g in first]
    assert ids == [[s.response_ids for s in g] for g in again]
    other = rollout.generate(requests(), replace(params, seed=8))
    assert ids != [[s.response_ids for s in g] for g in other]
    for group in first:
        for s in group:
            assert len(s.logprobs) == len(s.response_ids) and max(s.logprobs) <= 0


def test_a_copy_for_overlap_follows_pushed_weights_only():
    """prepare_overlap: generation reads a copy; update_weights refreshes it."""
    rollout = backend()
    live = rollout.model
    rollout.prepare_overlap()
    assert rollout.model is not live
    params = SamplingParams(n=1, max_new_tokens=4, temperature=0.0)
    before = rollout.generate(requests(), params)
    with torch.no_grad():
        for p in live.parameters():
            p.add_(torch.randn_like(p))
    assert [g[0].response_ids for g in rollout.generate(requests(), params)] == \
        [g[0].response_ids for g in before]  # the trainer's change is not seen yet
    rollout.update_weights(live)
    assert all(torch.equal(a, b) for a, b in zip(rollout.model.state_dict().values(),
                                                 live.state_dict().values()))
