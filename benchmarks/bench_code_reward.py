"""Wall time of ``CodeReward.score_batch`` by ``batch_workers``: a step's code responses
scored one after another against in threads.

Each response is a short stdin program (a sum of two integers) with one test; each test is
one sandboxed process at the strongest containment level this machine has. For each
``batch_workers`` in ``--workers`` this scores ``--responses`` responses ``--rounds`` times
and prints the median wall time per response, the trainer process's own CPU time per
response, and the speed-up over ``batch_workers=1``. The last line is one JSON object.

Usage:
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_code_reward.py \\
        [--responses 32] [--workers 1 2 4 8] [--rounds 3]
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gepo_xtuner.reward import CodeReward  # noqa: E402

RECORD = {'domain': 'code', 'tests': [{'input': '2 3\n', 'output': '5\n'}]}
SOLUTION = '```python\na, b = map(int, input().split())\nprint(a + b)\n```'


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Times each ``batch_workers`` setting; returns the printed figures by setting."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--responses', type=int, default=32, help='responses per batch')
    parser.add_argument('--workers', type=int, nargs='+', default=[1, 2, 4, 8],
                        help='batch_workers settings to time (the first is the reference)')
    parser.add_argument('--rounds', type=int, default=3, help='batches per setting')
    args = parser.parse_args(argv)
    completions, records = [SOLUTION] * args.responses, [RECORD] * args.responses
    results: dict[str, dict[str, float]] = {}
    for workers in args.workers:
        reward = CodeReward(timeout_s=6, batch_workers=workers)
        assert reward(SOLUTION, RECORD) == 1.0  # warm-up: the sandbox's one-time checks
        walls, cpus = [], []
        for _ in range(args.rounds):
            t0, c0 = time.perf_counter(), time.process_time()
            scores = reward.score_batch(completions, records)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            assert all(float(s) == 1.0 for s in scores), scores
        results[str(workers)] = {
            'wall_ms_per_response': statistics.median(walls) / args.responses * 1e3,
            'trainer_cpu_ms_per_response': statistics.median(cpus) / args.responses * 1e3}
    base = results[str(args.workers[0])]['wall_ms_per_response']
    print(f'{args.responses} responses x {args.rounds} rounds, sandbox: '
          f'{reward.sandbox.isolation}')
    for workers, row in results.items():
        row['speedup'] = base / row['wall_ms_per_response']
        print(f'batch_workers={workers}: {row["wall_ms_per_response"]:.1f} ms/response wall, '
              f'{row["trainer_cpu_ms_per_response"]:.1f} ms trainer CPU, '
              f'{row["speedup"]:.2f}x batch_workers={args.workers[0]}')
    print(json.dumps(results))
    return results


if __name__ == '__main__':
    main()
