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


def test_a_server_backends_request_slots_are_its_max_concurrency_on_each_server():
    """What the streaming stage compares ``groups_in_flight x n`` with (it warns when the
    slots are fewer): ``max_concurrency`` on each server named, the cap the pool keeps
    above."""
    from gepo_xtuner.rollout.hf import HFRolloutBackend
    from gepo_xtuner.rollout.lmdeploy.backend import LMDeployRolloutBackend
    from gepo_xtuner.rollout.vllm.backend import VLLMRolloutBackend
    two = VLLMRolloutBackend(server_url='http://127.0.0.1:9,http://127.0.0.1:10',
                             max_concurrency=3)
    assert two.request_slots() == 6
    assert LMDeployRolloutBackend(server_url='http://127.0.0.1:9',
                                  max_concurrency=5).request_slots() == 5
    assert HFRolloutBackend().request_slots() is None  # one batch per call, no slots
