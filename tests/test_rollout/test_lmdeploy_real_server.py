"""LMDeployRolloutBackend against LMDeploy 0.18's own API server code, on CPU.

The server is ``lmdeploy.serve.openai.api_server.serve()`` as shipped (routers,
validation, sleeping and API-key middlewares, health monitor, generation-config merge,
stop words, request-handle pool, uvicorn); only its PyTorch engine, which needs CUDA, is
replaced by a CPU stand-in generating with the tiny policy (``lmdeploy_cpu_engine.py``).
Not covered here (GPU only): CUDA-IPC tensors rebuilt by the real engine, NCCL, the
real engine's batching and its vision-language path.
"""

import sys
import threading
import time

import httpx
import pytest
import torch

from gepo_xtuner.testbed.tiny import EOS_ID
from gepo_xtuner.rollout import (
    HFRolloutBackend,
    LMDeployRolloutBackend,
    LMDeployServerError,
    RolloutRequest,
    SamplingParams,
)
from gepo_xtuner.rollout.server.http import HTTPPool, ServerRequestError

from tests.test_engine.conftest import tiny_dir  # noqa: F401 (a fixture)

from .conftest import ROOT, load_policy

PROMPTS = [[1, 14, 20, 33], [1, 9, 9], [1, 40, 41, 42, 43, 44], [1, 5]]
JSON = {'Content-Type': 'application/json'}
SERVER_COMMAND = [sys.executable, '-m', 'tests.test_rollout.lmdeploy_cpu_engine', '{model_path}',
                  '--server-name', '{host}', '--server-port', '{port}',
                  '--logprobs-mode', 'raw_logprobs', '--enable-abort-handling']
SERVER_ENV = {'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1'}


def _backend(url: str, **kwargs) -> LMDeployRolloutBackend:
    kwargs = {'max_retries': 1, 'backoff_s': 0.01, 'timeout_s': 30.0, **kwargs}
    return LMDeployRolloutBackend(server_url=url, **kwargs)


def _requests(prompts=PROMPTS) -> list[RolloutRequest]:
    return [RolloutRequest(list(p)) for p in prompts]


def _hf(model, tok, prompts, params):
    hf = HFRolloutBackend()
    hf.attach(model, tok)
    return hf.generate(_requests(prompts), params)


# --------------------------------------------------------------------- generation
def test_greedy_ids_and_logprobs_match_in_process_hf_backend(real_server, tiny_model_dir):
    model, tok = load_policy(tiny_model_dir)
    free = SamplingParams(n=2, temperature=0.0, max_new_tokens=8, stop_token_ids=(EOS_ID,))
    stop = _hf(model, tok, PROMPTS, free)[0][0].response_ids[3]  # a token the model emits
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=8,
                            stop_token_ids=(EOS_ID, stop))
    expected = _hf(model, tok, PROMPTS, params)
    backend = _backend(real_server.url)
    backend.attach(model, tok)
    got = backend.generate(_requests(), params)
    backend.close()
    reasons = set()
    for exp_group, got_group in zip(expected, got):
        assert len(got_group) == 2
        for exp, sample in zip(exp_group, got_group):
            assert sample.response_ids == exp.response_ids
            assert sample.finish_reason == exp.finish_reason
            torch.testing.assert_close(torch.tensor(sample.logprobs), torch.tensor(exp.logprobs),
                                       atol=1e-4, rtol=0)
            reasons.add(sample.finish_reason)
    assert reasons == {'stop', 'length'}
    assert got[0][0].response_ids[-1] == stop  # the stop token is kept, with its logprob
    # every field that changes the distribution reached the engine as sent
    # (LMDeploy's engine turns temperature 0 into top_k 1 later, as the stand-in does)
    cfg = real_server.engine.requests[-1]['gen_config']
    assert (cfg.temperature, cfg.top_k, cfg.repetition_penalty, cfg.min_p) == (0, 0, 1, 0)


def test_sampled_logprobs_are_raw_before_temperature(real_server, tiny_model_dir):
    """temperature 0.7 / top-k 10: the server's logprobs are log_softmax(logits), untempered."""
    model, tok = load_policy(tiny_model_dir)
    backend = _backend(real_server.url)
    backend.attach(model, tok)
    groups = backend.generate(_requests(PROMPTS[:2]),
                              SamplingParams(n=3, temperature=0.7, top_k=10, max_new_tokens=6))
    backend.close()
    for prompt, group in zip(PROMPTS, groups):
        for s in group:
            ids = torch.tensor([prompt + s.response_ids])
            with torch.no_grad():
                logits = model(ids).logits[0, len(prompt) - 1:-1]
            raw = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None])[:, 0]
            torch.testing.assert_close(torch.tensor(s.logprobs), raw, atol=1e-4, rtol=0)
            tempered = torch.log_softmax(logits / 0.7, -1).gather(
                -1, ids[0, len(prompt):, None])[:, 0]
            assert not torch.allclose(torch.tensor(s.logprobs), tempered, atol=1e-3)


def test_many_requests_keep_order_and_the_server_runs_at_most_its_batch(lmdeploy_server,
                                                                        tiny_model_dir):
    server = lmdeploy_server(max_batch_size=3)
    server.engine.token_delay_s = 0.01
    model, tok = load_policy(tiny_model_dir)
    prompts = [[1, 10 + i, 20 + i] for i in range(12)]
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=4, stop_token_ids=(EOS_ID,))
    backend = _backend(server.url, max_concurrency=8, server_max_batch_size=3)
    backend.attach(model, tok)
    got = backend.generate(_requests(prompts), params)
    backend.close()
    assert [[s.response_ids for s in g] for g in got] == \
        [[s.response_ids for s in g] for g in _hf(model, tok, prompts, params)]
    assert server.engine.max_running == 3  # 8 sent at once, 3 run, the others queue


# ------------------------------------------------------------------------ stop words
def _stop_char(tiny_model_dir) -> tuple[int, str]:
    """A token the greedy policy emits on PROMPTS[0] that is not EOS, and its text."""
    model, tok = load_policy(tiny_model_dir)
    ids = _hf(model, tok, PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=8))
    token = next(t for t in ids[0][0].response_ids[1:] if t != EOS_ID)
    return token, tok.convert_ids_to_tokens(token)


def test_chat_template_stop_words_stay_with_the_default_eos_stop(lmdeploy_server,
                                                                 tiny_model_dir):
    """The loop's default stop ids are the tokenizer's EOS. Sent as ``stop_token_ids``
    they would replace the template's stop words and generation would run to the limit."""
    token, text = _stop_char(tiny_model_dir)
    server = lmdeploy_server(stop_words=[text])  # a named template's stop word, not EOS
    model, tok = load_policy(tiny_model_dir)
    backend = _backend(server.url)
    backend.attach(model, tok)
    got = backend.generate(_requests(PROMPTS[:1]), SamplingParams(
        temperature=0.0, max_new_tokens=16, stop_token_ids=(tok.eos_token_id,)))[0][0]
    backend.close()
    assert got.finish_reason == 'stop' and got.response_ids[-1] == token
    assert token not in got.response_ids[:-1]
    assert EOS_ID in server.engine.requests[-1]['gen_config'].stop_token_ids


def test_stop_ids_beyond_eos_replace_the_template_stop_words(lmdeploy_server, tiny_model_dir):
    """LMDeploy's rule, stated in docs/lmdeploy.md: explicit stop ids replace the
    template's stop words (EOS ids stay); the backend warns once."""
    token, text = _stop_char(tiny_model_dir)
    server = lmdeploy_server(stop_words=[text])
    model, tok = load_policy(tiny_model_dir)
    backend = _backend(server.url)
    backend.attach(model, tok)
    other = 7 if token != 7 else 8  # a stop id the policy does not emit first
    got = backend.generate(_requests(PROMPTS[:1]), SamplingParams(
        temperature=0.0, max_new_tokens=12, stop_token_ids=(EOS_ID, other)))[0][0]
    backend.close()
    assert token not in server.engine.requests[-1]['gen_config'].stop_token_ids
    assert token in got.response_ids[:-1] or got.finish_reason == 'length'


# ---------------------------------------------------------------- server settings
def test_server_without_logprobs_mode_is_explained(lmdeploy_server):
    server = lmdeploy_server(logprobs_mode=None)
    backend = _backend(server.url)
    with pytest.raises(LMDeployServerError, match='--logprobs-mode raw_logprobs') as err:
        backend.generate(_requests(PROMPTS[:1]), SamplingParams())
    assert 'HTTP 400' in str(err.value) and not server.engine.requests
    backend.close()


def test_api_keys(lmdeploy_server):
    server = lmdeploy_server(api_keys=['sesame'])
    params = SamplingParams(max_new_tokens=2)
    backend = _backend(server.url, api_key='sesame')
    assert len(backend.generate(_requests(PROMPTS[:2]), params)) == 2
    backend.close()
    backend = _backend(server.url, api_key='wrong')  # /health needs no key; the rest does
    with pytest.raises(LMDeployServerError, match='HTTP 401') as err:
        backend.generate(_requests(PROMPTS[:1]), params)
    assert 'set api_key to one of its --api-keys' in str(err.value)
    backend.close()


def test_a_validation_error_is_a_400_with_lmdeploys_message(real_server):
    answer = httpx.post(f'{real_server.url}/generate', json={'input_ids': 'x'}, headers=JSON)
    assert answer.status_code == 400
    assert answer.json()['message'].startswith('input_ids') and answer.json()['code'] == 400
    answer = httpx.post(f'{real_server.url}/sleep', content=b'')  # no JSON content type
    assert answer.status_code == 400 and 'application/json' in answer.json()['message']


# --------------------------------------------------------------------- sleep / wake
def test_ipc_mode_sleeps_after_generation_and_wakes_before_the_next(real_server):
    """Sleep/wake through the real endpoints; the CUDA-IPC push itself needs a GPU."""
    backend = _backend(real_server.url, weight_sync={'mode': 'ipc'})
    params = SamplingParams(max_new_tokens=2)
    backend.generate(_requests(PROMPTS[:1]), params)
    assert real_server.async_engine.is_sleeping and real_server.engine.sleep_level == 1
    backend.generate(_requests(PROMPTS[:1]), params)
    assert real_server.async_engine.is_sleeping and len(real_server.engine.requests) == 2
    with pytest.raises(LMDeployServerError, match='parameters are on CPU'):
        backend.update_weights(torch.nn.Linear(2, 2))
    backend.close()


def test_sleep_aborts_requests_still_running(real_server):
    """Why generate() sleeps only after every rank is done: /sleep ends running requests."""
    real_server.engine.token_delay_s = 0.05
    answers = []
    # ignore_eos: a sampled end-of-sequence token would end the request before /sleep does
    body = {'input_ids': PROMPTS[0], 'max_tokens': 40, 'return_logprob': True,
            'ignore_eos': True}
    thread = threading.Thread(target=lambda: answers.append(
        httpx.post(f'{real_server.url}/generate', json=body, headers=JSON, timeout=30)))
    thread.start()
    while real_server.engine.running == 0:
        time.sleep(0.01)
    assert httpx.post(f'{real_server.url}/sleep', headers=JSON).status_code == 200
    thread.join(30)
    meta = answers[0].json()['meta_info']
    assert meta['finish_reason'] == {'type': 'abort'} and meta['completion_tokens'] < 40


def test_a_restarted_trainer_attaches_to_the_server_it_put_to_sleep(real_server):
    """IPC mode leaves the server asleep after every rollout; /health still says
    'healthy' for up to 12 s, /is_sleeping is live. The next trainer must wake it."""
    first = _backend(real_server.url, weight_sync={'mode': 'ipc'})
    first.generate(_requests(PROMPTS[:1]), SamplingParams(max_new_tokens=2))
    first.close()  # the trainer stops (crash, preemption) with the server asleep
    health = httpx.get(f'{real_server.url}/health').json()
    assert health['status'] == 'healthy' and real_server.async_engine.is_sleeping
    resumed = _backend(real_server.url, weight_sync={'mode': 'ipc'}, max_retries=2)
    resumed.attach(None, None)
    got = resumed.generate(_requests(PROMPTS[:2]), SamplingParams(max_new_tokens=3))
    resumed.close()
    assert [len(g) for g in got] == [1, 1] and real_server.async_engine.is_sleeping


def test_attach_after_the_health_snapshot_says_sleeping(lmdeploy_server):
    """Later than 12 s /health answers 'sleeping' (here after 0.2 s): still no 'start one'."""
    server = lmdeploy_server(env={'LMDEPLOY_HEALTH_POLL_INTERVAL': '0.2',
                                  'LMDEPLOY_HEALTH_PROBE_TIMEOUT': '0.1'})
    _backend(server.url, weight_sync={'mode': 'ipc'}).generate(
        _requests(PROMPTS[:1]), SamplingParams(max_new_tokens=2))
    deadline = time.monotonic() + 10
    while httpx.get(f'{server.url}/health').json()['status'] != 'sleeping':
        assert time.monotonic() < deadline
        time.sleep(0.05)
    backend = _backend(server.url, weight_sync={'mode': 'ipc'})
    backend.attach(None, None)
    assert len(backend.generate(_requests(PROMPTS[:1]), SamplingParams(max_new_tokens=2))) == 1
    backend.close()
    # a backend that does not manage sleep says the server is asleep, not missing
    other = _backend(server.url, weight_sync={'mode': 'none'})
    with pytest.raises(LMDeployServerError, match='is_sleeping answers true') as err:
        other.attach(None, None)
    assert 'Start one' not in str(err.value) and '/wakeup' in str(err.value)


def test_sleep_level_2_refuses_to_generate_from_dropped_weights(real_server):
    backend = _backend(real_server.url, weight_sync={'mode': 'ipc', 'sleep_level': 2})
    backend.generate(_requests(PROMPTS[:1]), SamplingParams(max_new_tokens=1))
    assert real_server.engine.sleep_level == 2
    with pytest.raises(LMDeployServerError, match='call update_weights'):
        backend.generate(_requests(PROMPTS[:1]), SamplingParams(max_new_tokens=1))
    backend.close()
    # ... and so does a trainer started afresh on that server
    again = _backend(real_server.url, weight_sync={'mode': 'ipc', 'sleep_level': 2})
    with pytest.raises(LMDeployServerError, match='call update_weights'):
        again.generate(_requests(PROMPTS[:1]), SamplingParams(max_new_tokens=1))
    again.close()


# ------------------------------------------------------------------------ weights
def test_ipc_is_refused_for_a_tensor_parallel_server(lmdeploy_server):
    server = lmdeploy_server(tp=2)
    backend = _backend(server.url, weight_sync={'mode': 'ipc'})
    with pytest.raises(LMDeployServerError, match=r'2 tensor-parallel ranks.*--tp 1'):
        backend.attach(None, None)
    backend.close()
    _backend(server.url, weight_sync={'mode': 'none'}).attach(None, None)  # fine otherwise


def test_engine_errors_point_to_the_server_log(real_server):
    """An exception in LMDeploy's engine is a bare-text 500; /update_weights answers
    ``null`` on success. The client's error says where the detail is."""
    real_server.engine.failing.add('sleep')
    backend = _backend(real_server.url, weight_sync={'mode': 'ipc'}, max_retries=0)
    with pytest.raises(LMDeployServerError, match='Internal Server Error') as err:
        backend.generate(_requests(PROMPTS[:1]), SamplingParams(max_new_tokens=1))
    assert 'the traceback is in the output of `lmdeploy serve api_server`' in str(err.value)
    backend.close()
    http = HTTPPool(real_server.url, max_retries=0)
    with pytest.raises(ServerRequestError) as raw:  # a CUDA-IPC push without CUDA
        http.request('POST', '/update_weights', json={'serialized_named_tensors': 'x'})
    assert (raw.value.status, raw.value.body) == (500, 'Internal Server Error')
    http.close()


def test_launched_server_and_nccl_protocol_with_gloo_broadcast(tiny_model_dir, tmp_path):
    """The server launched by the backend (its own process, as in production; the two ends
    of a weight-update group cannot share one), then init/update/destroy weights-update
    group through LMDeploy's endpoints, gloo in place of NCCL; the stand-in joins with
    LMDeploy's ``init_custom_process_group``. Every push passes the push check (on by
    default); once the engine is told to ignore weight updates (it receives them and
    answers success), the next push is caught, naming the server and the gap."""
    model, tok = load_policy(tiny_model_dir)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=(EOS_ID,))
    ignore = tmp_path / 'ignore_updates'
    backend = LMDeployRolloutBackend(launch={
        'model_path': str(tiny_model_dir), 'port': 0, 'command': SERVER_COMMAND,
        'env': {**SERVER_ENV, 'GEPO_CPU_ENGINE_IGNORE_UPDATES_FILE': str(ignore)},
        'log_file': str(tmp_path / 'server.log'), 'startup_timeout_s': 120},
        max_retries=0, weight_sync={'mode': 'nccl', 'backend': 'gloo', 'timeout_s': 60,
                                    'bucket_bytes': 1 << 16})
    backend.attach(model, tok)
    try:
        for seed in (1, 2):
            gen = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=gen) * 0.5)
            backend.update_weights(model)
            assert backend.pop_metrics()['rollout/probe_abs_diff'] < 1e-4  # float32 both
            got = backend.generate(_requests(PROMPTS[:2]), greedy)
            assert [g[0].response_ids for g in got] == \
                [g[0].response_ids for g in _hf(model, tok, PROMPTS[:2], greedy)]
        ignore.touch()  # the engine now drops what it receives
        with torch.no_grad():
            for p in model.parameters():  # a small step: within the tolerance
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * 1e-3)
        with pytest.raises(LMDeployServerError) as caught:
            backend.update_weights(model)
        message = str(caught.value)
        assert f'LMDeploy server {backend.url}: after weight push 3' in message, message
        assert 'the ones it gave for weight version 2' in message
        assert 'did not reach the engine' in message and "the trainer's moved by up to" in message
        ignore.unlink()
        # a refused group operation is a 400 with the reason, reported at once
        answer = httpx.post(f'{backend.url}/destroy_weights_update_group', headers=JSON,
                            json={'group_name': 'nope'})
        assert answer.status_code == 400 and 'not initialized' in answer.json()['message']
    finally:
        backend.close()
    log = (tmp_path / 'server.log').read_text()
    assert 'CPU stand-in engine' in log and 'Traceback' not in log


# ---------------------------------------------------------------------- timeouts
def test_requests_queued_behind_the_batch_limit_do_not_time_out(lmdeploy_server):
    """8 requests at once on a server that runs 2: four waves of about 0.6 s each. The
    first-wave time limit of 1.2 s is the time of one generation; the queue is
    allowed for (timeout_s x 4 waves)."""
    server = lmdeploy_server(max_batch_size=2)
    server.engine.token_delay_s = 0.1
    params = SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=(EOS_ID,))
    prompts = [[1, 20, 20 + i] for i in range(8)]
    backend = _backend(server.url, max_concurrency=8, timeout_s=1.2, max_retries=0,
                       server_max_batch_size=2)
    got = backend.generate(_requests(prompts), params)
    assert backend.request_timeout_s == pytest.approx(4.8)
    backend.close()
    assert len(got) == 8 and server.engine.max_running == 2
    # a server that does not answer at all is still given up on
    server.engine.token_delay_s = 2.0
    backend = _backend(server.url, max_concurrency=1, timeout_s=0.3, max_retries=0,
                       server_max_batch_size=2)
    start = time.monotonic()
    with pytest.raises(LMDeployServerError, match=r'no answer within 0\.3 s'):
        backend.generate(_requests(prompts[:1]), params)
    assert time.monotonic() - start < 5
    backend.close()


# ------------------------------------------------------------------ xtuner train
def test_one_rl_step_through_xtuner_train(lmdeploy_server, tiny_dir, tmp_path):
    """``xtuner train`` (its entry point, a process of its own) samples from LMDeploy's
    server code and pushes its new weights over the weight-update-group protocol (gloo).
    The server's raw logprobs equal the trainer's at temperature 1."""
    from tests.test_engine.conftest import scalars, train, write_config
    server = lmdeploy_server(tiny_dir / 'model')
    cfg = write_config(tmp_path, extra=f"""
        train_cfg = dict(rollout=dict(
            _delete_=True, type='LMDeployRolloutBackend', server_url={server.url!r},
            max_retries=0, timeout_s=120, weight_sync=dict(mode='nccl', backend='gloo',
                                                           timeout_s=120)))
    """)
    train(cfg, tmp_path / 'run', tiny_dir, 'train_cfg.max_steps=1', 'train_cfg.val=None')
    logged = scalars(tmp_path / 'run')
    assert logged[1]['rollout/logprob_abs_diff'] < 1e-4
    assert logged[1]['rollout/server/0/requests'] == 4 * 4  # B x K, one request each
    assert not server.engine.groups  # the trainer tore its group down at the end
    probes = [r for r in server.engine.requests if r['gen_config'].logprob_start_len >= 0]
    assert len(server.engine.requests) - len(probes) == 16
    assert len(probes) == 2  # the push check: at attach, and after the one push


def _two_rank_sleep_level_2(rank: int, url: str, init_file: str, out: str) -> None:
    """One rank of a 2-process gloo job generating twice with sleep_level 2."""
    import torch.distributed as dist
    dist.init_process_group('gloo', init_method=f'file://{init_file}', rank=rank, world_size=2)
    backend = _backend(url, weight_sync={'mode': 'ipc', 'sleep_level': 2})
    try:
        backend.generate(_requests(PROMPTS[:1]), SamplingParams(max_new_tokens=1))
        try:
            backend.generate(_requests(PROMPTS[:1]), SamplingParams(max_new_tokens=1))
            message = 'no error'
        except LMDeployServerError as e:
            message = str(e)
        with open(f'{out}/rank{rank}', 'w') as f:
            f.write(message)
        dist.barrier()
    finally:
        backend.close()
        dist.destroy_process_group()


def test_sleep_level_2_error_reaches_every_rank(real_server, tmp_path):
    """Only rank 0 wakes the server; its refusal must reach the other rank, which would
    otherwise wait in a collective for ever: both ranks fail with the same error."""
    import torch.multiprocessing as mp
    ctx = mp.get_context('spawn')
    procs = [ctx.Process(target=_two_rank_sleep_level_2,
                         args=(rank, real_server.url, str(tmp_path / 'init'), str(tmp_path)))
             for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=90)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, 'a rank hung'
    assert [p.exitcode for p in procs] == [0, 0]
    messages = [(tmp_path / f'rank{r}').read_text() for r in range(2)]
    assert 'call update_weights' in messages[0] and messages[1] == messages[0]


def test_generation_ahead_through_xtuner_train(lmdeploy_server, tiny_dir, tmp_path):
    """``train_cfg.max_staleness=1`` against LMDeploy's server code: the trainer's worker
    thread generates the next batch while the trainer updates, and no weight push reaches
    the server while any of its requests runs (every batch from one weight version).
    From step 2 on, the server's logprobs are one version old: they differ from the
    trainer's recomputed ones, and the behaviour weight corrects for it."""
    import asyncio
    from tests.test_engine.conftest import scalars, train, write_config
    server = lmdeploy_server(tiny_dir / 'model')
    engine, events = server.engine, []
    generate, receive = engine.generate, engine.update_weights_from_distributed

    async def logged_generate(*args, **kwargs):
        if args[2].logprob_start_len >= 0:  # the push check's probe, right after a push
            events.append('probe')
            async for out in generate(*args, **kwargs):
                yield out
            return
        events.append('start')
        try:
            async for out in generate(*args, **kwargs):
                yield out
        finally:
            events.append('end')

    async def logged_update(*args, **kwargs):
        events.append('push')
        return await receive(*args, **kwargs)

    engine.generate, engine.update_weights_from_distributed = logged_generate, logged_update
    assert asyncio.iscoroutinefunction(receive)
    cfg = write_config(tmp_path, extra=f"""
        train_cfg = dict(max_staleness=1, rollout=dict(
            _delete_=True, type='LMDeployRolloutBackend', server_url={server.url!r},
            max_retries=0, timeout_s=120, weight_sync=dict(mode='nccl', backend='gloo',
                                                           timeout_s=120)))
    """)
    train(cfg, tmp_path / 'run', tiny_dir, 'train_cfg.max_steps=3', 'train_cfg.val=None',
          'train_cfg.rewards.default.type=DigitShareReward')  # every step moves the weights
    logged = scalars(tmp_path / 'run')
    assert [logged[t]['rollout/staleness'] for t in (1, 2, 3)] == [0, 1, 1]
    assert logged[1]['rollout/logprob_abs_diff'] < 1e-4
    assert min(logged[t]['rollout/logprob_abs_diff'] for t in (2, 3)) > 1e-4
    assert all('offpolicy/weight_mean' in logged[t] for t in (2, 3))
    # 3 batches of B x K = 16 requests, 3 pushes, never one while a request runs
    assert events.count('start') == 48 and events.count('push') >= 3
    assert events.count('probe') == 4  # at attach and after each of the 3 pushes
    running = 0
    for event in events:
        running += {'start': 1, 'end': -1, 'push': 0, 'probe': 0}[event]
        assert event not in ('push', 'probe') or running == 0, events
