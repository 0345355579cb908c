"""``ServerPool.map`` called from several threads at once (the streaming stage's
``groups_in_flight`` workers): a call that finds every ready server at
``max_concurrency`` with the other calls' requests waits for a slot instead of reporting
that no server is ready, and every call gets its own results."""

import threading
import time

from gepo_xtuner.rollout.server.pool import ServerPool


def test_calls_that_find_every_slot_taken_wait_for_one():
    pool = ServerPool(['http://127.0.0.1:9'], max_concurrency=2)  # fn sends nothing
    for s in pool.servers:
        pool.mark_synced(s, pool.version)
    running, most = [0], [0]
    lock = threading.Lock()

    def fn(http, item):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02)  # a generation the server is running
        with lock:
            running[0] -= 1
        return item

    results, errors = {}, []

    def call(c):
        try:
            results[c] = pool.map(fn, [(c, i) for i in range(3)])
        except Exception as e:  # noqa: BLE001 (the test reports it)
            errors.append(repr(e))

    threads = [threading.Thread(target=call, args=(c, )) for c in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    pool.close()
    assert not errors, errors
    assert results == {c: [(c, i) for i in range(3)] for c in range(6)}
    assert most[0] <= 2  # the cap holds over all the calls together
