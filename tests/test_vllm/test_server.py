"""``VLLMRolloutBackend`` against a real ``vllm serve`` (vLLM 0.32's CPU build, its own
engine and kernels) serving the tiny policy in float32: generation, weight pushes proven by
logprob probes, and faults. The server is the session's (``vllm_server`` in
``tests/conftest.py``); each test that needs particular weights in it pushes them first."""

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import torch

from gepo_xtuner.registry import ROLLOUT_BACKENDS
from gepo_xtuner.rollout import RolloutRequest, SamplingParams, VLLMServerError
from gepo_xtuner.rollout.server.weights import save_weights
from gepo_xtuner.rollout.vllm.protocol import build_completion_payload
from gepo_xtuner.rollout.vllm.server import VLLMServerProcess
from gepo_xtuner.testbed.tiny import EOS_ID

from ..test_rollout.conftest import load_policy

PROMPTS = [[1, 5, 9, 12], [1, 7], [1, 20, 21, 22, 23, 30], [1, 3]]
PROBE = [1, 11, 4, 30, 7, 22, 9, 15, 2, 40, 13]


def backend_for(url, **kw):
    kw.setdefault('weight_sync', dict(mode='disk'))
    kw.setdefault('timeout_s', 120.0)
    return ROLLOUT_BACKENDS.build(dict(type='VLLMRolloutBackend', server_url=url, **kw))


def trainer_logprobs(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def probe_gap(backend, model):
    return (torch.tensor(backend.probe_logprobs(PROBE)) - trainer_logprobs(model, PROBE)
            ).abs().max().item()


def perturb(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)


@pytest.fixture
def policy(vllm_server, tiny_model_dir):
    """The tiny policy and a backend attached to the session's server: attaching pushed the
    policy's weights (the server may have held another test's)."""
    model, tok = load_policy(tiny_model_dir)
    backend = backend_for(vllm_server.url)
    backend.attach(model, tok)
    yield model, backend
    backend.close()


def test_each_push_gives_the_server_the_trainers_logprobs(policy):
    """After every push the server's logprobs of a fixed probe, and of responses it sampled,
    equal the trainer's under the new weights (float32 on both sides: rounding only); a
    step whose push is skipped leaves a gap that the probe shows."""
    model, backend = policy
    assert probe_gap(backend, model) < 1e-4
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=8, stop_token_ids=(EOS_ID,))
    for step in range(3):
        perturb(model, step)
        assert probe_gap(backend, model) > 1e-2, step  # the server still has the old weights
        backend.update_weights(model)
        assert probe_gap(backend, model) < 1e-4, step
        for prompt, group in zip(PROMPTS, backend.generate([RolloutRequest(p) for p in PROMPTS],
                                                           params)):
            for s in group:
                expected = trainer_logprobs(model, prompt + s.response_ids)[len(prompt) - 1:]
                assert torch.allclose(torch.tensor(s.logprobs), expected, atol=1e-4, rtol=0)
    assert backend.state_dict()['num_updates'] == 3  # the push of attach is not an update


def test_a_push_the_probe_disproves_is_refused(policy, vllm_server):
    """vLLM's own in-place reload (``weight_sync.reload='vllm'``) on the CPU build leaves the
    tied ``lm_head``'s packed matrix on the old weights: the sampled tokens change, the
    logprobs are wrong. With ``probe_tolerance`` that push is refused, naming the gap; the
    backend's own reload (the default) passes the same check. The first half fails once vLLM
    reloads tied heads itself, which is worth knowing."""
    model, _ = policy
    strict = {'mode': 'disk', 'probe_tolerance': 1e-4}
    plain = backend_for(vllm_server.url, weight_sync=dict(strict, reload='vllm'))
    plain.attach(model, None)
    perturb(model, 7)
    with pytest.raises(VLLMServerError, match=r'differ from the trainer.s by up to .*'
                                              r'probe_tolerance=0.0001.*not run the weights'):
        plain.update_weights(model)
    assert probe_gap(plain, model) > 0.05
    plain.close()

    own = backend_for(vllm_server.url, weight_sync=strict)
    own.attach(model, None)
    own.update_weights(model)
    assert own.pop_metrics()['rollout/probe_abs_diff'] < 1e-4
    own.close()


def test_seeded_groups_are_reproducible_and_resume_where_they_left(policy, vllm_server):
    """With ``sampling.seed`` request ``r`` of the run is sampled with ``seed + r``: the same
    requests give the same groups from a fresh backend, the next call other ones, and a
    backend restored from :meth:`state_dict` continues the sequence."""
    model, backend = policy
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=8, stop_token_ids=(EOS_ID,),
                            seed=123)
    requests = [RolloutRequest(p) for p in PROMPTS]
    ids = lambda groups: [[s.response_ids for s in g] for g in groups]  # noqa: E731
    first, second = ids(backend.generate(requests, params)), ids(backend.generate(requests,
                                                                                  params))
    assert first != second
    assert any(len({tuple(r) for r in group}) > 1 for group in first)  # K different samples
    # one prompt twice in a call: two groups of their own, not one group shifted by a sample
    twice = ids(backend.generate([RolloutRequest(PROMPTS[2])] * 2, params))
    assert twice[0] != twice[1] and twice[0][1:] != twice[1][:-1]
    again = backend_for(vllm_server.url)
    assert ids(again.generate(requests, params)) == first
    resumed = backend_for(vllm_server.url)
    resumed.load_state_dict(again.state_dict())
    assert ids(resumed.generate(requests, params)) == second
    for b in (again, resumed):
        b.close()


def test_batched_prompts_come_back_as_their_own_groups(policy, vllm_server):
    """Unseeded, more prompts than request slots: several prompts share a request (two
    bodies here, by ``max_batch_seqs``, and a third for the prompts with other ``extra``),
    and every group answers its own prompt (its logprobs are the trainer's for that prompt,
    a group of another prompt would not match), in the order asked, with the lengths the
    request's ``extra`` set."""
    model, _ = policy  # the server holds the policy's weights
    backend = backend_for(vllm_server.url, weight_sync=dict(mode='none'), max_concurrency=1,
                          max_batch_seqs=9)  # 3 prompts x n=3 per request at most
    backend.attach(model, None)
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=6, stop_token_ids=(EOS_ID,))
    prompts = PROMPTS + PROMPTS[::-1]
    requests = [RolloutRequest(p, extra={'min_tokens': 6} if i % 3 == 0 else {})
                for i, p in enumerate(prompts)]
    groups = backend.generate(requests, params)
    assert [len(g) for g in groups] == [3] * len(prompts)
    for i, (prompt, group) in enumerate(zip(prompts, groups)):
        for s in group:
            if i % 3 == 0:
                assert len(s.response_ids) == 6, i
            expected = trainer_logprobs(model, prompt + s.response_ids)[len(prompt) - 1:]
            assert torch.allclose(torch.tensor(s.logprobs), expected, atol=1e-4, rtol=0), i
    # [1, 2, 4] and [5, 7] without extra, [0, 3, 6] with it
    assert backend.pop_metrics()['rollout/server/0/requests'] == 3
    backend.close()


def test_many_seeded_groups_at_once_leave_the_server_up(policy):
    """Seeded groups whose prompts together exceed one engine step's token budget (2048 on
    CPU): with chunked prefill, vLLM 0.32's CPU build splits a prompt and its seeded
    sampler then fails the whole engine ('CPU Generator does not use offset'); the launch
    turns chunking off, so every group comes back and the server still answers."""
    _, backend = policy
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=2, seed=5)
    requests = [RolloutRequest([1] + [(7 * i + k) % 40 + 3 for k in range(60)])
                for i in range(16)]  # 16 x 8 sequences of 61 prompt tokens: 7808 tokens
    groups = backend.generate(requests, params)
    assert [len(g) for g in groups] == [8] * 16
    assert len(backend.generate(requests[:1], params)) == 1


def test_the_payload_is_valid_for_vllms_own_request_model(vllm_env):
    """The body the backend sends, read by vLLM 0.32's ``CompletionRequest`` (in vLLM's
    environment): every distribution field arrives as sent, nothing is dropped."""
    params = SamplingParams(n=3, temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=6,
                            stop_token_ids=(EOS_ID,), seed=4)
    body = build_completion_payload('policy', RolloutRequest([1, 5, 9]), params, seed=9)
    script = (
        'import json, sys\n'
        'from vllm.entrypoints.openai.completion.protocol import CompletionRequest\n'
        'r = CompletionRequest.model_validate(json.loads(sys.argv[1]))\n'
        'sp = r.to_sampling_params(max_tokens=r.max_tokens, default_sampling_params={})\n'
        'print(json.dumps({k: getattr(sp, k) for k in ("n", "temperature", "top_p", "top_k",'
        ' "min_p", "seed", "max_tokens", "logprobs", "repetition_penalty", "stop_token_ids",'
        ' "presence_penalty", "frequency_penalty")}))\n')
    proc = subprocess.run([str(vllm_env / 'bin' / 'python'), '-c', script, json.dumps(body)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == dict(n=3, temperature=0.7, top_p=0.9, top_k=5, min_p=0.0, seed=9,
                       max_tokens=6, logprobs=0, repetition_penalty=1.0,
                       stop_token_ids=[EOS_ID], presence_penalty=0.0, frequency_penalty=0.0)


class _Proxy:
    """A loopback HTTP proxy to the real server that answers ``alive`` requests and then
    drops every connection unanswered, as a server that dies mid-batch; with ``delay_s``,
    it holds each generation that long first, as a slow server; with ``until_abort``, it
    holds each generation until it has passed a ``POST /abort_requests`` on, as a network
    that delivers them after the abort; with ``drop_reloads``, it answers ``POST
    /collective_rpc`` (the reload) with success itself and never passes it on, as a
    reload that never reaches the engine."""

    def __init__(self, target: str, alive: int = 10**9, delay_s: float = 0.0,
                 until_abort: bool = False, drop_reloads: bool = False):
        proxy = self
        self.target, self.left, self.delay_s = target, alive, delay_s
        self.dropped = 0  # reloads answered and not passed on
        self.generations = 0  # POST /v1/completions received
        self.aborted = threading.Event()
        if not until_abort:
            self.aborted.set()
        self.lock = threading.Condition()
        self.handling = 0  # requests being forwarded

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _forward(self, method):
                with proxy.lock:
                    proxy.left -= 1
                    dead = proxy.left < 0
                if dead:
                    self.connection.close()  # no answer: the client sees the connection drop
                    return
                if self.path == '/v1/completions':
                    with proxy.lock:
                        proxy.generations += 1
                    time.sleep(proxy.delay_s)
                    proxy.aborted.wait(60)
                length = int(self.headers.get('Content-Length') or 0)
                content = self.rfile.read(length) if length else None
                if drop_reloads and self.path == '/collective_rpc':
                    proxy.dropped += 1
                    resp = httpx.Response(200, json={'results': [None]})
                else:
                    resp = httpx.request(method, proxy.target + self.path, timeout=120,
                                         content=content,
                                         headers={'Content-Type': 'application/json'})
                if self.path == '/abort_requests':
                    proxy.aborted.set()
                self.send_response(resp.status_code)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(resp.content)))
                self.end_headers()
                try:
                    self.wfile.write(resp.content)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout under test): nobody to answer

            def handle_one_request(self):
                with proxy.lock:
                    proxy.handling += 1
                try:
                    super().handle_one_request()
                finally:
                    with proxy.lock:
                        proxy.handling -= 1
                        proxy.lock.notify_all()

            def do_GET(self):
                self._forward('GET')

            def do_POST(self):
                self._forward('POST')

        self.server = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.url = f'http://127.0.0.1:{self.server.server_address[1]}'
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        """Stops serving once every request it took has been forwarded and answered: a
        request it still held would reach the session's server during a later test."""
        self.aborted.set()
        try:
            with self.lock:  # one request per connection (HTTP/1.0): none waits idle
                assert self.lock.wait_for(lambda: self.handling == 0, timeout=60)
        finally:
            self.server.shutdown()
            self.server.server_close()


def test_a_reload_that_never_reaches_the_engine_is_caught_at_the_first_push(policy,
                                                                          vllm_server):
    """Every call of the push answers success, but the reload never reaches the engine
    (a proxy drops it): with the default settings the first push after attach is refused,
    naming the server, the gap and that its answer did not move while the trainer's did,
    although the gap is within the default tolerance. The same push straight to the server
    passes, its gap float32 rounding."""
    model, direct = policy  # the server holds the policy's weights
    proxy = _Proxy(vllm_server.url, drop_reloads=True)
    backend = backend_for(proxy.url)
    backend.attach(model, None)  # its push is dropped too, but the weights are there already
    assert backend.pop_metrics()['rollout/probe_abs_diff'] < 1e-4
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():  # a small step: the gap stays within the tolerance
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 1e-3)
    with pytest.raises(VLLMServerError) as caught:
        backend.update_weights(model)
    message = str(caught.value)
    assert f'vLLM server {proxy.url}: after weight push 1' in message, message
    assert 'the ones it gave for weight version 0' in message
    assert 'did not reach the engine' in message and "the trainer's moved by up to" in message
    assert proxy.dropped == 2
    backend.close()
    proxy.close()
    direct.update_weights(model)
    assert direct.pop_metrics()['rollout/probe_abs_diff'] < 1e-4


def test_a_server_that_dies_mid_batch_fails_over_or_fails_clearly(policy, vllm_server):
    """Two servers, one of which stops answering after a few groups: every group still comes
    back whole (the dead server's requests go to the other) and the dead one is out. Alone,
    the same death is an error naming the server, not a short batch."""
    model, _ = policy
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=6, stop_token_ids=(EOS_ID,))
    requests = [RolloutRequest(p) for p in PROMPTS * 4]
    dying = _Proxy(vllm_server.url, alive=4)  # health, /v1/models, then two groups
    # one request per group (max_batch_seqs=0): the proxy's count of answers is groups
    pair = backend_for([dying.url, vllm_server.url], max_retries=0, max_concurrency=2,
                       weight_sync=dict(mode='none'), max_batch_seqs=0)
    pair.attach(model, None)
    groups = pair.generate(requests, params)
    assert len(groups) == len(requests) and all(len(g) == 3 for g in groups)
    metrics = pair.pop_metrics()
    assert metrics['rollout/server/0/taken_out'] == 1 and metrics['rollout/servers_ready'] == 1
    assert metrics['rollout/server/1/requests'] >= len(requests) - 2
    pair.close()

    alone_proxy = _Proxy(vllm_server.url, alive=3)
    alone = backend_for(alone_proxy.url, max_retries=0, weight_sync=dict(mode='none'))
    alone.attach(model, None)
    with pytest.raises(VLLMServerError, match=alone_proxy.url):
        alone.generate(requests, params)
    alone.close()
    for proxy in (dying, alone_proxy):
        proxy.close()


def test_a_server_that_refuses_the_model_fails_the_launch_with_its_log(vllm_env, tmp_path):
    """A model directory vLLM cannot load: the launch fails with the exit code and the
    server's own error from its log."""
    bad = tmp_path / 'model'
    bad.mkdir()
    (bad / 'config.json').write_text(json.dumps({'model_type': 'no_such_architecture'}))
    server = VLLMServerProcess(model_path=str(bad), python=str(vllm_env / 'bin' / 'python'),
                               port=0, max_model_len=64, startup_timeout_s=600,
                               log_file=str(tmp_path / 'server.log'))
    with pytest.raises(RuntimeError, match=r'the vLLM server \(.*\) exited with code') as e:
        server.start()
    assert 'Traceback' in str(e.value) or 'Error' in str(e.value)
    assert server.proc is None


def test_a_slow_server_is_an_error_that_names_the_wait(policy, vllm_server):
    """Answers later than ``timeout_s``: the request fails with the address and the wait,
    never a short group."""
    model, _ = policy
    proxy = _Proxy(vllm_server.url, delay_s=3.0)
    slow = backend_for(proxy.url, timeout_s=1.0, max_retries=0, weight_sync=dict(mode='none'))
    slow.attach(model, None)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=4)
    with pytest.raises(VLLMServerError, match=f'{proxy.url}.*no answer within 1'):
        slow.generate([RolloutRequest(p) for p in PROMPTS[:1]], params)
    slow.close()
    proxy.close()


def _server_counter(url: str, name: str, label: str = '') -> float:
    """The sum of the Prometheus samples ``name{...}`` that ``url/metrics`` shows (those
    whose labels include ``label``, e.g. ``'finished_reason="length"'``)."""
    text = httpx.get(f'{url}/metrics', timeout=10).text
    return sum(float(line.rsplit(' ', 1)[1]) for line in text.splitlines()
               if line.startswith(name + '{') and label in line)


def _generate_aside(backend, requests, params) -> tuple[threading.Thread, dict]:
    """``backend.generate`` on a started thread, as ``RolloutAhead`` runs it; the dict
    gets ``'groups'`` or the ``VLLMServerError``'s text as ``'error'``."""
    outcome = {}

    def work():
        try:
            outcome['groups'] = backend.generate(requests, params)
        except VLLMServerError as e:
            outcome['error'] = str(e)

    thread = threading.Thread(target=work)
    thread.start()
    return thread, outcome


def test_abort_cancels_the_groups_in_flight_on_the_server(policy, vllm_server):
    """The step that wanted a batch failed (``RolloutAhead.discard``): ``abort`` stops the
    generation running on another thread at the server, whose running requests drop to
    none, and the call raises instead of returning a batch."""
    model, backend = policy

    def running() -> float:
        return _server_counter(vllm_server.url, 'vllm:num_requests_running')

    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=100)
    requests = [RolloutRequest([1, 5, 9], extra={'ignore_eos': True}) for _ in range(64)]
    thread, outcome = _generate_aside(backend, requests, params)
    deadline = time.monotonic() + 60
    while (now := running()) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert now > 0
    backend.abort()
    thread.join(30)
    assert not thread.is_alive() and 'groups' not in outcome
    assert 'generation aborted' in outcome['error']
    deadline = time.monotonic() + 5  # the gauge is refreshed at the server's next step
    while (now := running()) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert now == 0
    with pytest.raises(VLLMServerError, match='was aborted'):
        backend.generate(requests[:1], params)


def test_abort_also_ends_requests_that_reach_the_server_after_it(policy, vllm_server):
    """A request still on its way when ``POST /abort_requests`` reached the server is not
    among the requests that call aborts. Here a proxy delivers every group only after it
    passed the first abort call on: ``abort`` keeps aborting until none of its requests is
    in flight, so the server generates a small share of the tokens the groups would have
    taken (all of them if the abort was sent once), and ends few of them by length."""
    model, _ = policy
    proxy = _Proxy(vllm_server.url, until_abort=True)
    backend = backend_for(proxy.url, weight_sync=dict(mode='none'), max_concurrency=16,
                          max_batch_seqs=0)  # a request per prompt: the proxy counts them
    backend.attach(model, None)
    params = SamplingParams(n=64, temperature=1.0, max_new_tokens=120)
    requests = [RolloutRequest([1, 5, 9], extra={'ignore_eos': True}) for _ in range(16)]
    full = len(requests) * params.n * params.max_new_tokens

    def counters() -> tuple[float, float]:
        return (_server_counter(vllm_server.url, 'vllm:generation_tokens_total'),
                _server_counter(vllm_server.url, 'vllm:request_success_total',
                                'finished_reason="length"'))

    before = counters()
    thread, outcome = _generate_aside(backend, requests, params)
    deadline = time.monotonic() + 60
    while proxy.generations < len(requests) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proxy.generations == len(requests)
    backend.abort()
    thread.join(120)
    assert not thread.is_alive() and 'groups' not in outcome
    assert 'generation aborted' in outcome['error']
    after = counters()
    generated, by_length = after[0] - before[0], after[1] - before[1]
    assert generated < full / 2, (generated, full)
    assert by_length < len(requests) * params.n / 2, by_length
    backend.close()
    proxy.close()
