"""``VLLMRolloutBackend.abort``'s loop against a stand-in for ``vllm serve`` (a loopback
HTTP server that holds each ``POST /v1/completions`` until it is told to answer): which
servers are asked to abort, how often, and when the call returns. A stand-in because the
real server generates a group of the tiny policy in under a second, too fast to hold a
request at a chosen point; ``tests/test_vllm/test_server.py`` aborts the real server.
The routes and bodies are vLLM 0.32's (``/health``, ``/v1/models``, ``/abort_requests``
of its RL dev router, answering ``{"status": "aborted", "aborted": n}``)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gepo_xtuner.registry import ROLLOUT_BACKENDS
from gepo_xtuner.rollout import RolloutRequest, SamplingParams, VLLMServerError

from .test_server import _generate_aside as generate_aside

PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=4)


class StandInServer:
    """Holds every generation until ``release`` is set; ``POST /abort_requests`` answers
    ``abort_status`` and, when that is 200, releases the held generations once it has been
    called ``release_after`` times (the earlier calls came before they arrived)."""

    def __init__(self, abort_status: int = 200, release_after: int = 1):
        self.abort_status, self.release_after = abort_status, release_after
        self.aborts, self.held = 0, 0
        self.release = threading.Event()
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == '/health':
                    self._answer(200, {})
                elif self.path == '/v1/models':
                    self._answer(200, {'data': [{'id': 'policy'}]})
                else:
                    self._answer(404, {'detail': 'Not Found'})

            def do_POST(self):
                self.rfile.read(int(self.headers.get('Content-Length') or 0))
                if self.path == '/abort_requests':
                    with outer.lock:
                        outer.aborts += 1
                        if outer.abort_status == 200 and outer.aborts >= outer.release_after:
                            outer.release.set()
                    self._answer(outer.abort_status, {'status': 'aborted', 'aborted': 0})
                    return
                with outer.lock:
                    outer.held += 1
                outer.release.wait(30)
                # vLLM answers an aborted request 200 with finish_reason 'abort'
                self._answer(200, {'choices': [{'index': 0, 'token_ids': [5],
                                                'finish_reason': 'abort'}]})

        self.server = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.url = f'http://127.0.0.1:{self.server.server_address[1]}'
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in(request):
    server = StandInServer(**getattr(request, 'param', {}))
    yield server
    server.close()


def _backend(url):
    backend = ROLLOUT_BACKENDS.build(dict(type='VLLMRolloutBackend', server_url=url,
                                          weight_sync=dict(mode='none'), timeout_s=30.0,
                                          max_batch_seqs=0))  # a request per prompt, counted
    backend.attach(None, None)
    return backend


def _generate_aside(backend, n_requests):
    return generate_aside(backend, [RolloutRequest([1, 2, 3]) for _ in range(n_requests)],
                          PARAMS)


def _wait_held(server, n):
    deadline = time.monotonic() + 30
    while server.held < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.held == n


@pytest.mark.parametrize('stand_in', [dict(release_after=3)], indirect=True)
def test_abort_is_sent_again_until_nothing_is_in_flight(stand_in):
    """The server ends the held groups only at the third abort call (the first two came
    before they were registered): ``abort`` sends it three times and returns, and the
    generation raises."""
    backend = _backend(stand_in.url)
    thread, outcome = _generate_aside(backend, 3)
    _wait_held(stand_in, 3)
    backend.abort()
    assert stand_in.aborts == 3
    thread.join(10)
    assert not thread.is_alive() and 'generation aborted' in outcome['error']
    backend.close()


@pytest.mark.parametrize('stand_in', [dict(abort_status=404)], indirect=True)
def test_a_server_that_refuses_the_abort_is_asked_once(stand_in):
    """No RL routes (404): ``abort`` asks once, then waits for the requests to run to
    their end without asking again."""
    backend = _backend(stand_in.url)
    thread, outcome = _generate_aside(backend, 2)
    _wait_held(stand_in, 2)
    threading.Timer(1.5, stand_in.release.set).start()  # the generations end on their own
    backend.abort()
    assert stand_in.aborts == 1 and stand_in.release.is_set()
    thread.join(10)
    assert not thread.is_alive() and 'generation aborted' in outcome['error']
    backend.close()


def test_abort_with_nothing_in_flight_contacts_no_server(stand_in):
    """The generation had ended (``discard`` can race the worker's last return): the
    servers' other requests (other ranks') are left alone."""
    stand_in.release.set()
    backend = _backend(stand_in.url)
    with pytest.raises(VLLMServerError):  # the stand-in's answer is an aborted group
        backend.generate([RolloutRequest([1, 2, 3])], PARAMS)
    backend.abort()
    assert stand_in.aborts == 0
    with pytest.raises(VLLMServerError, match='was aborted'):
        backend.generate([RolloutRequest([1, 2, 3])], PARAMS)
    backend.close()
