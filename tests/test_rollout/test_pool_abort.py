"""``ServerPool.abort`` ends a running ``map`` call without dropping work unrun: requests in
flight return, nothing more is dispatched, the call raises ``PoolAbortedError``, and no
thread waits forever (the thread pools are not shut down under queued work)."""

import threading
import time

import pytest

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
    release.set()  # the server ends what it ran
    thread.join(10)
    assert not thread.is_alive()
    assert 'result' not in outcome and 'requests unsent' in outcome['error']
    assert len(started) == 2  # nothing was dispatched after the abort
    with pytest.raises(PoolAbortedError):
        pool.map(fn, [1])
    pool.close()
