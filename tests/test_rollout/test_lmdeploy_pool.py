"""LMDeployRolloutBackend over several servers: load spread, failover, rejoin, weight sync.

The servers are LMDeployProtocolDouble (not LMDeploy: its engines need a GPU), each a
real HTTP server on loopback, in a thread (for fault injection) or as a real process
(to be killed with SIGKILL). Every test compares each result with the greedy answer
to *its* prompt, so a lost, swapped or duplicated result fails it.
"""

import os
import random
import signal
import sys

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
from gepo_xtuner.rollout.lmdeploy.backend import read_address_file
from gepo_xtuner.rollout.lmdeploy.server import LMDeployServerProcess

from .conftest import ROOT, load_policy
from .protocol_double import LMDeployProtocolDouble

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=3, stop_token_ids=(EOS_ID,))
PROMPTS = [[1, 3 + i, 40 - i, 7 + 2 * i] for i in range(24)]  # all different
DOUBLE_ENV = {'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1'}


def _requests(prompts=PROMPTS) -> list[RolloutRequest]:
    return [RolloutRequest(list(p)) for p in prompts]


def _reference(model, tok, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    hf = HFRolloutBackend()
    hf.attach(model, tok)
    return [g[0].response_ids for g in hf.generate(_requests(prompts), params)]


def _ids(groups) -> list[list[int]]:
    assert all(len(g) == 1 for g in groups)
    return [g[0].response_ids for g in groups]


def _answered(metrics: dict[str, float]) -> int:
    return int(sum(v for k, v in metrics.items() if k.endswith('/requests')))


@pytest.fixture
def doubles(tiny_model_dir):
    """Three protocol doubles (not LMDeploy) in threads, on free local ports."""
    ds = [LMDeployProtocolDouble(str(tiny_model_dir)).start() for _ in range(3)]
    yield ds
    for d in ds:
        d.stop()


@pytest.fixture(scope='module')
def reference(tiny_model_dir):
    model, tok = load_policy(tiny_model_dir)
    return _reference(model, tok)


def _process(tiny_model_dir, tmp_path, name: str, port: int = 0, delay_s: float = 0.0):
    """A protocol double (not LMDeploy) as its own process, as a server job would run."""
    command = [sys.executable, '-m', 'tests.test_rollout.protocol_double', '{model_path}',
               '--server-name', '{host}', '--server-port', '{port}', '--logprobs-mode',
               'raw_logprobs', '--delay-s', str(delay_s)]
    server = LMDeployServerProcess(model_path=str(tiny_model_dir), port=port, command=command,
                                   env=DOUBLE_ENV, log_file=str(tmp_path / f'{name}.log'),
                                   startup_timeout_s=120)
    server.start()
    return server


def test_load_is_spread_so_no_server_idles_while_another_has_a_queue(doubles, reference):
    for d in doubles:
        d.delay_s = 0.05
    backend = LMDeployRolloutBackend(server_url=[d.url for d in doubles], max_concurrency=2,
                                     max_retries=0, timeout_s=30)
    got = _ids(backend.generate(_requests(), GREEDY))
    metrics = backend.pop_metrics()
    backend.close()
    assert got == reference
    # every server ran its full share in parallel: none waited while requests queued
    assert [d.max_in_flight for d in doubles] == [2, 2, 2]
    assert [metrics[f'rollout/server/{i}/max_outstanding'] for i in range(3)] == [2, 2, 2]
    assert sum(d.generate_attempts for d in doubles) == len(PROMPTS) == _answered(metrics)
    assert min(d.generate_attempts for d in doubles) >= 4
    assert all(metrics[f'rollout/server/{i}/tokens_per_sec'] > 0 for i in range(3))


def test_a_slow_server_gets_fewer_requests(doubles, reference):
    doubles[0].delay_s = 0.4
    doubles[1].delay_s = doubles[2].delay_s = 0.02
    backend = LMDeployRolloutBackend(server_url=','.join(d.url for d in doubles),
                                     max_concurrency=1, max_retries=0, timeout_s=30)
    got = _ids(backend.generate(_requests(), GREEDY))
    backend.close()
    assert got == reference
    slow, fast = doubles[0].generate_attempts, min(d.generate_attempts for d in doubles[1:])
    assert slow < fast, (slow, fast)


def test_a_sleeping_server_is_not_ready_until_it_wakes(doubles, reference):
    asleep = doubles[1]
    asleep.sleeping_tags = {'weights', 'kv_cache'}  # /is_sleeping answers true
    backend = LMDeployRolloutBackend(server_url=[d.url for d in doubles[:2]], max_retries=0,
                                     timeout_s=30, retry_after_s=0)
    assert _ids(backend.generate(_requests(), GREEDY)) == reference
    assert asleep.generate_attempts == 0
    assert backend.pop_metrics()['rollout/server/1/ready'] == 0
    asleep.sleeping_tags = set()
    assert _ids(backend.generate(_requests(), GREEDY)) == reference
    metrics = backend.pop_metrics()
    backend.close()
    assert asleep.generate_attempts > 0 and metrics['rollout/server/1/rejoined'] == 1


def test_no_ready_server_at_start_names_every_one(doubles):
    for d in doubles:
        d.sleeping_tags = {'weights', 'kv_cache'}
    backend = LMDeployRolloutBackend(server_url=[d.url for d in doubles], timeout_s=30)
    with pytest.raises(LMDeployServerError, match='no awake LMDeploy server') as err:
        backend.attach(None, None)
    assert all(f'{d.url}: out: {d.url}/is_sleeping answers true' in str(err.value)
               for d in doubles)


def test_a_server_killed_mid_step_loses_nothing(tiny_model_dir, tmp_path, reference,
                                                monkeypatch):
    """SIGKILL to one of three server processes while it holds a request."""
    from gepo_xtuner.rollout.lmdeploy import backend as lmdeploy
    servers = [_process(tiny_model_dir, tmp_path, f's{i}', delay_s=0.3) for i in range(3)]
    backend = LMDeployRolloutBackend(server_url=[s.url for s in servers], max_concurrency=2,
                                     max_retries=1, backoff_s=0.05, timeout_s=30)
    victim, sent = servers[1], []
    generate_one = lmdeploy._generate_one

    def kill_on_second_request(http, payload, *args):
        sent.append(http.base_url)
        if sent.count(victim.url) == 2:  # its first request is being answered now
            os.killpg(victim.proc.pid, signal.SIGKILL)
        return generate_one(http, payload, *args)

    monkeypatch.setattr(lmdeploy, '_generate_one', kill_on_second_request)
    try:
        got = _ids(backend.generate(_requests(), GREEDY))
        metrics = backend.pop_metrics()
    finally:
        backend.close()
        for s in servers:
            s.close()
    assert got == reference  # every request answered, by its own result
    assert _answered(metrics) == len(PROMPTS)  # ... exactly once
    assert metrics['rollout/server/1/requests'] == 0
    assert metrics['rollout/server/1/resent'] == 2 and metrics['rollout/server/1/failures'] == 2
    assert metrics['rollout/server/1/taken_out'] == 1 and metrics['rollout/server/1/ready'] == 0
    assert metrics['rollout/servers_ready'] == 2


def _perturb(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)


def _write_address(path, url: str, tp: int = 1) -> None:
    """As tools/slurm_lmdeploy_server.sh writes it."""
    path.write_text(f'GEPO_LMDEPLOY_URL={url}\nGEPO_LMDEPLOY_TP={tp}\n')


def test_weight_sync_reaches_every_server_and_a_server_back_rejoins(tiny_model_dir, tmp_path):
    """Address files of server jobs; NCCL weight sync over gloo (one group per server).

    A server killed between steps and started again (on its initial weights) serves
    nothing until the next sync has given it the current weights; a server whose
    address file appears later joins at the next sync.
    """
    model, tok = load_policy(tiny_model_dir)
    a, b = (_process(tiny_model_dir, tmp_path, n) for n in 'ab')
    servers = [a, b]
    addr = tmp_path / 'servers'
    addr.mkdir()
    _write_address(addr / 'a.env', a.url)
    _write_address(addr / 'b.env', b.url)
    backend = LMDeployRolloutBackend(
        address_files=str(addr / '*.env'), max_retries=0, timeout_s=60, retry_after_s=0,
        weight_sync={'mode': 'nccl', 'backend': 'gloo', 'timeout_s': 60,
                     'bucket_bytes': 1 << 16})

    def each_server() -> list[list[list[int]]]:
        """What every server generates now, asked one by one."""
        out = []
        for s in servers:
            one = LMDeployRolloutBackend(server_url=s.url, timeout_s=60)
            out.append(_ids(one.generate(_requests(PROMPTS[:6]), GREEDY)))
            one.close()
        return out

    try:
        backend.attach(model, tok)
        assert backend._pool.urls == [a.url, b.url]
        _perturb(model, 1)
        backend.update_weights(model)
        want = _reference(model, tok, PROMPTS[:6])
        assert each_server() == [want, want]

        b_port = b.port
        b.stop()
        assert _ids(backend.generate(_requests(PROMPTS[:6]), GREEDY)) == want
        backend.pop_metrics()
        b = servers[1] = _process(tiny_model_dir, tmp_path, 'b2', port=b_port)  # initial weights
        assert _ids(backend.generate(_requests(PROMPTS[:6]), GREEDY)) == want
        metrics = backend.pop_metrics()
        assert metrics['rollout/server/1/requests'] == 0  # healthy, but stale: not used

        c = _process(tiny_model_dir, tmp_path, 'c')
        servers.append(c)
        _write_address(addr / 'c.env', c.url, tp=1)
        _perturb(model, 2)
        backend.update_weights(model)
        want = _reference(model, tok, PROMPTS[:6])
        assert backend._pool.urls == [a.url, b.url, c.url]
        assert each_server() == [want, want, want]
        got = _ids(backend.generate(_requests(), GREEDY))
        metrics = backend.pop_metrics()
        assert got == _reference(model, tok)
        assert all(metrics[f'rollout/server/{i}/requests'] > 0 for i in range(3))
        assert metrics['rollout/server/1/rejoined'] == 1
    finally:
        backend.close()
        for s in servers:
            s.close()
    assert not any('Traceback' in (tmp_path / f'{n}.log').read_text() for n in ('a', 'b2', 'c'))


@pytest.mark.parametrize('text, match', [
    ('GEPO_LMDEPLOY_TP=2\n', 'has no GEPO_LMDEPLOY_URL'),
    ('GEPO_LMDEPLOY_URL=node3:1\n', "unexpected line 'GEPO_LMDEPLOY_URL=node3:1'"),
    ('GEPO_LMDEPLOY_URL=http://n:1\nGEPO_LMDEPLOY_TP=two\n', "unexpected line"),
])
def test_bad_address_files_say_what_is_wrong(tmp_path, text, match):
    path = tmp_path / 'srv.env'
    path.write_text(text)
    with pytest.raises(LMDeployServerError, match=match):
        read_address_file(path)
    _write_address(path, 'http://n:5', 2)
    assert read_address_file(path) == ('http://n:5', 2)


def test_no_address_file_yet_is_a_clear_error(tmp_path):
    backend = LMDeployRolloutBackend(address_files=str(tmp_path / '*.env'))
    with pytest.raises(LMDeployServerError, match='tools/slurm_lmdeploy_server.sh'):
        backend.attach(None, None)
    (tmp_path / 'a.env').write_text('GEPO_LMDEPLOY_URL=node3:1\n')
    with pytest.raises(LMDeployServerError, match=r"a\.env: unexpected line"):
        backend.attach(None, None)


def test_50_steps_of_random_faults_lose_and_duplicate_nothing(doubles, tiny_model_dir,
                                                               reference):
    """Each step, up to two of three servers misbehave: answer 5xx, hang past the
    timeout, go to sleep, or die (and come back on the same port a few steps later)."""
    rng = random.Random(0)
    backend = LMDeployRolloutBackend(server_url=[d.url for d in doubles], max_concurrency=2,
                                     max_retries=1, backoff_s=0.01, timeout_s=0.5,
                                     retry_after_s=0, weight_sync={'mode': 'none'})
    backend.attach(None, None)
    dead: dict[int, int] = {}  # server -> step it comes back
    totals = {'failures': 0, 'resent': 0, 'rejoined': 0, 'taken_out': 0}
    prompts = PROMPTS[:12]
    try:
        for step in range(50):
            for i, back in list(dead.items()):
                if step >= back:
                    port = int(doubles[i].url.rsplit(':', 1)[1])
                    doubles[i] = LMDeployProtocolDouble(str(tiny_model_dir), port=port).start()
                    del dead[i]
            for d in doubles:
                d.delay_s, d.fail_next, d.sleeping_tags = 0.0, [], set()
            alive = [i for i in range(3) if i not in dead]
            for i in rng.sample(alive, rng.randint(0, len(alive) - 1)):
                fault = rng.choice(['5xx', 'hang', 'sleep', 'die'])
                if fault == '5xx':
                    doubles[i].fail_next = [rng.choice([500, 502, 503])] * rng.randint(1, 6)
                elif fault == 'hang':
                    doubles[i].delay_s = 1.0
                elif fault == 'sleep':
                    doubles[i].sleeping_tags = {'weights', 'kv_cache'}
                else:
                    doubles[i].stop()
                    dead[i] = step + rng.randint(1, 4)
            got = _ids(backend.generate(_requests(prompts), GREEDY))
            metrics = backend.pop_metrics()
            assert got == reference[:12], f'step {step}'
            assert _answered(metrics) == len(prompts), f'step {step}'
            for key in totals:
                totals[key] += int(sum(v for k, v in metrics.items() if k.endswith('/' + key)))
    finally:
        backend.close()
    assert totals['failures'] > 10 and totals['resent'] > 10
    assert totals['taken_out'] > 10 and totals['rejoined'] > 5


def test_a_zero3_partitioned_policy_is_refused_before_any_push(doubles):
    """DeepSpeed ZeRO-3 marks each partitioned parameter with ``ds_id`` (set here by hand)."""
    backend = LMDeployRolloutBackend(server_url=doubles[0].url,
                                     weight_sync={'mode': 'nccl', 'backend': 'gloo'})
    model = torch.nn.Linear(2, 2)
    model.weight.ds_id = 0
    with pytest.raises(LMDeployServerError, match='ZeRO-3'):
        backend.update_weights(model)
    assert doubles[0].calls == []
    backend.close()
