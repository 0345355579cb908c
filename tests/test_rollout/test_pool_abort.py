"""``ServerPool.abort`` ends a running ``map`` call without dropping work unrun: requests in
flight return, nothing more is dispatched, the call raises ``PoolAbortedError``, and no
thread waits forever (the thread pools are not shut down under queued work). The
connections of requests in flight stay open: only the server ends those."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gepo_xtuner.rollout.server.http import HTTPPool, ServerRequestError
from gepo_xtuner.rollout.server.pool import PoolAbortedError, ServerPool


def test_abort_ends_a_running_map_with_requests_in_flight_and_queued():
    pool = ServerPool(['http://127.0.0.1:9'], max_concurrency=2)  # nothing listens there
    for s in pool.servers:
        pool.mark_synced(s, pool.version)
    release, started = threading.Event(), []

    def fn(http, item):
        started.append(item)
        release.wait(10)  # a generation the server is running
        return item

    outcome = {}

    def call():
        try:
            outcome['result'] = pool.map(fn, list(range(20)))
        except PoolAbortedError as e:
            outcome['error'] = str(e)

    thread = threading.Thread(target=call)
    thread.start()
    while len(started) < 2:
        time.sleep(0.01)
    pool.abort()
    assert not pool.wait_idle(0.05)  # two requests still run on the server
    release.set()  # the server ends what it ran
    assert pool.wait_idle(10)
    thread.join(10)
    assert not thread.is_alive()
    assert 'result' not in outcome and 'requests unsent' in outcome['error']
    assert len(started) == 2  # nothing was dispatched after the abort
    with pytest.raises(PoolAbortedError):
        pool.map(fn, [1])
    pool.close()


def test_an_aborted_http_pool_stops_retrying_and_sends_nothing_more():
    """A server that answers 503 (retried with backoff): after ``abort`` the request in
    its backoff wait fails at once and is not sent again, and a new request is not sent
    at all."""
    hits = []

    class Busy(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            hits.append(self.path)
            self.rfile.read(int(self.headers.get('Content-Length') or 0))
            self.send_response(503)
            self.send_header('Content-Length', '0')
            self.end_headers()

    server = ThreadingHTTPServer(('127.0.0.1', 0), Busy)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    http = HTTPPool(f'http://127.0.0.1:{server.server_address[1]}', max_retries=5,
                    backoff_s=30.0)
    outcome = {}

    def call():
        try:
            http.request('POST', '/v1/completions', json={})
        except ServerRequestError as e:
            outcome['error'] = str(e)

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 30
    while not hits and time.monotonic() < deadline:
        time.sleep(0.01)
    http.abort()
    thread.join(10)  # not the 30 s backoff
    assert not thread.is_alive() and 'aborted' in outcome['error']
    with pytest.raises(ServerRequestError, match='not sent'):
        http.request('POST', '/v1/completions', json={})
    assert hits == ['/v1/completions']
    http.close()
    server.shutdown()
    server.server_close()
