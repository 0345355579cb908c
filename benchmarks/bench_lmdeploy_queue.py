"""Queue-aware request timeouts against LMDeploy's own API server code (CPU stand-in engine).

LMDeploy runs at most ``--max-batch-size`` requests at once and queues the rest; the client
waits ``timeout_s`` per queue wave (``LMDeployRolloutBackend.request_timeout_s``). This sends
``--requests`` requests at once (one rank, ``max_concurrency`` = requests) to servers with
``--max-batch-size`` 8 and 2, with the client told the server's batch size or not, and
prints the waves, the client's limit, the wall time, the most requests the server ran at
once, and whether the call finished::

    python benchmarks/bench_lmdeploy_queue.py [--requests 8] [--token-delay-s 0.1] [--timeout-s 1.2]

The server is ``lmdeploy.serve.openai.api_server.serve()`` with the CPU stand-in of
``tests/test_rollout/lmdeploy_cpu_engine.py`` (LMDeploy's engine needs CUDA).
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--requests', type=int, default=8)
    parser.add_argument('--tokens', type=int, default=6)
    parser.add_argument('--token-delay-s', type=float, default=0.1)
    parser.add_argument('--timeout-s', type=float, default=1.2)
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    from gepo_xtuner.testbed.tiny import EOS_ID, build_char_tokenizer, build_tiny_model
    from gepo_xtuner.rollout import LMDeployRolloutBackend, RolloutRequest, SamplingParams
    from tests.test_rollout.lmdeploy_cpu_engine import LMDeployCPUServer

    model_dir = tempfile.mkdtemp(prefix='bench_lmdeploy_queue_')
    tok = build_char_tokenizer()
    build_tiny_model(len(tok), seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    params = SamplingParams(temperature=0.0, max_new_tokens=args.tokens,
                            stop_token_ids=(EOS_ID,))
    requests = [RolloutRequest([1, 20, 20 + i % 30]) for i in range(args.requests)]
    for batch, told in ((args.requests, 128), (2, 128), (2, 2)):
        server = LMDeployCPUServer(model_dir, max_batch_size=batch).start()
        warm = LMDeployRolloutBackend(server_url=server.url, timeout_s=60)
        warm.generate(requests[:1], params)
        warm.close()
        server.engine.token_delay_s, server.engine.max_running = args.token_delay_s, 0
        backend = LMDeployRolloutBackend(server_url=server.url, max_concurrency=args.requests,
                                         timeout_s=args.timeout_s, max_retries=0,
                                         server_max_batch_size=told)
        start = time.monotonic()
        try:
            backend.generate(requests, params)
            result = 'done'
        except RuntimeError:
            result = 'timed out'
        wall = time.monotonic() - start
        print(f'--max-batch-size {batch:3d}, server_max_batch_size={told:3d}: '
              f'{backend.queue_waves} wave(s), client waits up to '
              f'{backend.request_timeout_s:.1f} s; wall {wall:.2f} s, at most '
              f'{server.engine.max_running} running: {result}', flush=True)
        backend.close()
        server.stop()


if __name__ == '__main__':
    main()
