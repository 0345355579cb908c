"""The protocol double answers as LMDeploy's own API server where it stands in for it.

Every test runs twice, against LMDeploy 0.18's server code (CPU stand-in engine) and
against ``LMDeployProtocolDouble``, with the same assertions: a difference between
the two fails here, not as a bug that only the double's tests cannot see.
"""

import json
import shutil
import threading
import time

import httpx
import pytest

from gepo_xtuner.testbed.tiny import EOS_ID

from .protocol_double import LMDeployProtocolDouble

JSON = {'Content-Type': 'application/json'}
PROMPT = [1, 14, 20, 33]


class _Server:
    """The real server or the double behind one interface."""

    def __init__(self, kind: str, start_real, model_dir, stop_words=None, **kwargs) -> None:
        self.kind = kind
        if kind == 'real':
            from transformers import AutoTokenizer
            tok = AutoTokenizer.from_pretrained(model_dir)
            words = None if stop_words is None else tok.convert_ids_to_tokens(stop_words)
            self.real = start_real(model_dir, stop_words=words, **kwargs)
            self.url, self.double = self.real.url, None
        else:
            self.double = LMDeployProtocolDouble(str(model_dir), stop_words=stop_words,
                                                 **kwargs).start()
            self.url = self.double.url

    def set_token_delay(self, seconds: float) -> None:
        (self.real.engine if self.double is None else self.double).token_delay_s = seconds

    @property
    def max_running(self) -> int:
        return (self.real.engine if self.double is None else self.double).max_running

    @property
    def running(self) -> int:
        return (self.real.engine if self.double is None else self.double).running

    def stop(self) -> None:
        if self.double is not None:
            self.double.stop()


@pytest.fixture(params=['real', 'double'])
def serve(request, lmdeploy_server, tiny_model_dir):
    """A factory: ``serve(model_dir=None, **kwargs)`` starts the real server or the double."""
    started = []

    def start(model_dir=None, **kwargs) -> _Server:
        server = _Server(request.param, lmdeploy_server, model_dir or tiny_model_dir, **kwargs)
        started.append(server)
        return server
    yield start
    for server in started:
        server.stop()


def _generate(url: str, headers=JSON, **body) -> httpx.Response:
    body = {'input_ids': PROMPT, 'max_tokens': 8, 'temperature': 0.0, 'return_logprob': True,
            'include_stop_str_in_output': True, **body}
    return httpx.post(f'{url}/generate', json=body, headers=headers, timeout=30)


def test_invalid_bodies_are_400_with_lmdeploys_envelope(serve):
    server = serve()
    answer = _generate(server.url, input_ids='x')
    assert answer.status_code == 400
    assert answer.json()['message'].startswith('input_ids') and answer.json()['code'] == 400
    answer = httpx.post(f'{server.url}/sleep', content=b'')
    assert answer.status_code == 400
    assert answer.json()['message'] == "Unsupported Media Type: Only 'application/json' is allowed"


def test_health_is_a_cached_snapshot_and_is_sleeping_is_live(serve):
    server = serve()
    assert httpx.post(f'{server.url}/sleep', headers=JSON).content == b''  # empty, not null
    assert httpx.get(f'{server.url}/health').json()['status'] == 'healthy'  # for up to 12 s
    assert httpx.get(f'{server.url}/is_sleeping').json() == {'is_sleeping': True}
    answer = _generate(server.url)
    assert answer.status_code == 503 and 'sleeping' in answer.json()['message']
    assert httpx.post(f'{server.url}/wakeup', headers=JSON).content == b''
    assert _generate(server.url).status_code == 200


def test_sleep_aborts_running_requests(serve):
    server = serve()
    server.set_token_delay(0.05)
    answers = []
    thread = threading.Thread(target=lambda: answers.append(_generate(server.url, max_tokens=60)))
    thread.start()
    while server.running == 0:
        time.sleep(0.01)
    time.sleep(0.1)
    httpx.post(f'{server.url}/sleep', headers=JSON)
    thread.join(30)
    meta = answers[0].json()['meta_info']
    assert meta['finish_reason'] == {'type': 'abort'} and 0 < meta['completion_tokens'] < 60


def _emitted(server) -> list[int]:
    """The greedy answer to PROMPT with no stop but EOS."""
    return _generate(server.url, max_tokens=8).json()['output_ids']


def test_stop_set_template_words_eos_and_request_ids(serve, tmp_path, tiny_model_dir):
    probe = serve()
    first, second = [t for t in _emitted(probe) if t != EOS_ID][1:3]
    server = serve(stop_words=[first])  # the chat template's stop word
    answer = _generate(server.url).json()
    assert answer['output_ids'][-1] == first and answer['meta_info']['finish_reason'] == \
        {'type': 'stop'}
    answer = _generate(server.url, stop_token_ids=[second]).json()  # replaces the template's
    assert first not in answer['output_ids'][-1:] or answer['output_ids'][-1] == second
    # an eos_token_id list in generation_config.json: every id stops (no 500)
    model_dir = tmp_path / 'eos_list'
    shutil.copytree(tiny_model_dir, model_dir)
    cfg = json.loads((model_dir / 'generation_config.json').read_text())
    (model_dir / 'generation_config.json').write_text(json.dumps(
        {**cfg, 'eos_token_id': [EOS_ID, first]}))
    answer = _generate(serve(model_dir).url).json()
    assert answer['output_ids'][-1] == first and answer['meta_info']['finish_reason'] == \
        {'type': 'stop'}


def test_generation_config_defaults_fill_unset_fields(serve, tmp_path, tiny_model_dir):
    model_dir = tmp_path / 'greedy_default'
    shutil.copytree(tiny_model_dir, model_dir)
    cfg = json.loads((model_dir / 'generation_config.json').read_text())
    (model_dir / 'generation_config.json').write_text(json.dumps({**cfg, 'do_sample': True, 'top_k': 1}))
    greedy = _emitted(serve())
    server = serve(model_dir)
    body = {'input_ids': PROMPT, 'max_tokens': 8, 'include_stop_str_in_output': True}
    for _ in range(3):  # temperature and top_k unset: the file's top_k=1 makes it greedy
        answer = httpx.post(f'{server.url}/generate', json=body, headers=JSON).json()
        assert answer['output_ids'] == greedy


def test_session_len_api_keys_and_the_order_of_checks(serve):
    server = serve(session_len=12, api_keys=['sesame'])
    key = {**JSON, 'Authorization': 'Bearer sesame'}
    answer = _generate(server.url, headers=key, input_ids=list(range(1, 13)))
    assert answer.status_code == 400
    assert answer.json()['message'] == ('Input length (12) must be smaller than the model '
                                        'context length (12).')
    answer = _generate(server.url, headers=key, input_ids=[1] * 9, max_tokens=10).json()
    assert answer['meta_info']['completion_tokens'] <= 3  # the session ends at 12 tokens
    assert httpx.get(f'{server.url}/health').status_code == 200  # no key needed
    no_key_no_json = {'Content-Type': 'text/plain'}
    answer = _generate(server.url, headers=no_key_no_json)
    assert answer.status_code == 401 and answer.json()['message'] == 'Unauthorized.'
    httpx.post(f'{server.url}/sleep', headers=key)
    assert _generate(server.url, headers=no_key_no_json).status_code == 503  # asleep first


def test_weight_group_failures_are_400_and_engine_errors_bare_500(serve):
    server = serve()
    answer = httpx.post(f'{server.url}/destroy_weights_update_group', headers=JSON,
                        json={'group_name': 'nope'})
    assert answer.status_code == 400 and answer.json()['success'] is False
    answer = httpx.post(f'{server.url}/update_weights', headers=JSON,
                        json={'serialized_named_tensors': 'eA=='})  # CUDA IPC without CUDA
    assert (answer.status_code, answer.text) == (500, 'Internal Server Error')


def test_at_most_max_batch_size_requests_run_at_once(serve):
    server = serve(max_batch_size=2)
    server.set_token_delay(0.02)
    threads = [threading.Thread(target=_generate, args=(server.url,)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert server.max_running == 2
