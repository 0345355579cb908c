"""Length-aware batching of the in-process ``HFRolloutBackend``, on a real tiny model."""

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
