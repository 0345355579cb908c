"""``gepo_xtuner.testbed.longtail``: imposed long-tailed lengths, continuations included
(the parent's ``generate`` stood in for; no server)."""

import statistics

import pytest

from gepo_xtuner.engine.step.stream import continued
from gepo_xtuner.rollout.base import RolloutRequest, RolloutSample, SamplingParams
from gepo_xtuner.rollout.vllm.backend import VLLMRolloutBackend
from gepo_xtuner.testbed.longtail import PRIVATE_KEY, LongTailVLLMBackend, target_length


def test_target_lengths_are_deterministic_and_long_tailed() -> None:
    prompts = [[1, i % 7, i, i * 3 % 11] for i in range(4000)]
    lengths = sorted(target_length(p, 20, 10, 10_000) for p in prompts)
    assert lengths == sorted(target_length(p, 20, 10, 10_000) for p in prompts)
    p50, p99 = statistics.median(lengths), lengths[int(0.99 * len(lengths))]
    assert 18 <= p50 <= 22 and 7 <= p99 / p50 <= 14
    assert max(target_length(p, 20, 10, 64) for p in prompts) == 64
    assert any(target_length(p, 20, 10, 64, salt=1) != target_length(p, 20, 10, 64)
               for p in prompts[:10])


@pytest.fixture
def backend(monkeypatch):
    """The backend over a stand-in parent: every response runs to ``max_tokens`` unless
    ``cut_at`` cuts it; records the bodies' settings it was called with."""
    calls = []

    def parent(self, requests, params):
        calls.append(([r.extra for r in requests], params))
        n = min(params.max_new_tokens, self.cut_at or params.max_new_tokens)
        reason = 'abort' if n < params.max_new_tokens else 'length'
        return [[RolloutSample([5] * n, [-1.0] * n, reason) for _ in range(params.n)]
                for _ in requests]

    monkeypatch.setattr(VLLMRolloutBackend, 'generate', parent)
    b = LongTailVLLMBackend(median=20, tail=10, server_url='http://127.0.0.1:9',
                            weight_sync=dict(mode='none'))
    b.cut_at, b.calls = None, calls
    return b


def test_responses_get_their_target_and_stop(backend) -> None:
    requests = [RolloutRequest([1, 2, i]) for i in range(6)]
    out = backend.generate(requests, SamplingParams(n=3, max_new_tokens=500))
    for r, group in zip(requests, out):
        assert [len(s.response_ids) for s in group] == [target_length([1, 2, r.input_ids[2]],
                                                                       20, 10, 500)] * 3
        assert {s.finish_reason for s in group} == {'stop'}
    for extras, params in backend.calls:
        assert all(e == {'ignore_eos': True} for e in extras)  # the private key is not sent
        assert params.stop_token_ids == ()


def test_a_continuation_gets_what_is_left(backend) -> None:
    prompt = next([1, 2, i] for i in range(100) if target_length([1, 2, i], 20, 10, 500) > 12)
    target, cap = target_length(prompt, 20, 10, 500), 500
    request = RolloutRequest(list(prompt))
    backend.cut_at = 5
    [[cut]] = backend.generate([request], SamplingParams(n=1, max_new_tokens=cap))
    assert (len(cut.response_ids), cut.finish_reason) == (5, 'abort')
    assert request.extra[PRIVATE_KEY] == (len(prompt), target)
    backend.cut_at = None
    more = continued(request, cut.response_ids)  # the same extra dict, as the stream passes
    [[rest]] = backend.generate([more], SamplingParams(n=1, max_new_tokens=cap - 5))
    assert backend.calls[-1][1].max_new_tokens == target - 5
    assert (5 + len(rest.response_ids), rest.finish_reason) == (target, 'stop')


def test_a_target_at_the_cap_ends_for_length(backend) -> None:
    [[sample]] = backend.generate([RolloutRequest([1, 2, 3])], SamplingParams(n=1,
                                                                              max_new_tokens=1))
    assert (len(sample.response_ids), sample.finish_reason) == (1, 'length')
