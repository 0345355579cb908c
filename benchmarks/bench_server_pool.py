"""CPU benchmark: one rollout step's wall time over a pool of 1, 2 and 4 servers.

The servers are LMDeploy protocol doubles (``tests/test_rollout/protocol_double.py``,
not LMDeploy) in this process, each answering a ``/generate`` after ``--delay-s`` (a
stand-in for generation time) from a tiny random model, so the figures measure the
pool's dispatch and failover, not a model. For each pool size: the median wall time
of ``--repeats`` steps of ``--requests`` requests, and one step in which one server
is stopped while it holds requests (its requests go to the others).

Usage::

    python benchmarks/bench_server_pool.py [--requests 96] [--delay-s 0.05] [--concurrency 4]
"""

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a checkout without installing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--requests', type=int, default=96)
    parser.add_argument('--delay-s', type=float, default=0.05)
    parser.add_argument('--concurrency', type=int, default=4, help='per server')
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args()

    import torch
    torch.set_num_threads(1)
    from gepo_xtuner.testbed.tiny import build_char_tokenizer, build_tiny_model
    from gepo_xtuner.rollout import LMDeployRolloutBackend, RolloutRequest, SamplingParams
    from tests.test_rollout.protocol_double import LMDeployProtocolDouble

    model_dir = tempfile.mkdtemp(prefix='bench_pool_')
    tok = build_char_tokenizer()
    build_tiny_model(len(tok), seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)  # the doubles read the stop tokens from it
    requests = [RolloutRequest([1, 3 + i % 40, 7]) for i in range(args.requests)]
    params = SamplingParams(temperature=0.0, max_new_tokens=2)

    print(f'{args.requests} requests, {args.delay_s * 1000:.0f} ms each, '
          f'{args.concurrency} in flight per server')
    print('servers | step (median) | requests/s | step with one server stopped mid-step')
    for n in (1, 2, 4):
        doubles = [LMDeployProtocolDouble(model_dir).start() for _ in range(n)]
        for d in doubles:
            d.delay_s = args.delay_s
        backend = LMDeployRolloutBackend(server_url=[d.url for d in doubles],
                                         max_concurrency=args.concurrency, max_retries=0,
                                         timeout_s=30, weight_sync={'mode': 'none'})
        backend.generate(requests[:n], params)  # connections up
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            backend.generate(requests, params)
            times.append(time.perf_counter() - t)
        step = statistics.median(times)
        failover = ''
        if n > 1:
            threading.Timer(args.delay_s * 1.5, doubles[-1].stop).start()
            t = time.perf_counter()
            got = backend.generate(requests, params)
            failover = f'{time.perf_counter() - t:.3f} s ({sum(map(len, got))} answered)'
        backend.close()
        for d in doubles[:-1] if n > 1 else doubles:
            d.stop()
        print(f'{n:7d} | {step:11.3f} s | {args.requests / step:10.1f} | {failover}')


if __name__ == '__main__':
    main()
