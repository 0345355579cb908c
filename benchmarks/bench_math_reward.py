"""Cost of one ``MathReward`` check and of starting its helper process.

``MathReward`` runs math-verify in a persistent helper process
(:class:`gepo_xtuner.reward.worker.VerifierWorker`). The first call starts that process and
imports math-verify there; later calls send one request each. This times the first call,
then ``--calls`` warm calls cycling through the three examples of ``MathReward``'s docstring
(a LaTeX fraction, a leading-zero integer, a GSM8K ``#### N`` reference), and prints the
first call's time, the median warm call and their difference (the start-up cost). The last
line is one JSON object.

Usage:
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_math_reward.py [--calls 50]
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gepo_xtuner.reward import MathReward  # noqa: E402

CASES = (
    (r'Adding the cases gives $\boxed{\frac{14}{3}}$.', {'answer': '14/3'}, 1.0),
    (r'The remainder is \boxed{70}.', {'answer': '071'}, 0.0),
    ('She has 72 clips.', {'answer': 'Half of 48 is 24; 48 + 24 = 72.\n#### 72'}, 1.0),
)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Time the first and ``--calls`` warm checks; returns the printed figures (seconds)."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--calls', type=int, default=50, help='warm calls after the first')
    args = parser.parse_args(argv)
    reward = MathReward()
    completion, record, expected = CASES[0]
    t0 = time.perf_counter()
    score = reward(completion, record)
    first_s = time.perf_counter() - t0
    assert score == expected, (completion, score)
    warm = []
    for i in range(args.calls):
        completion, record, expected = CASES[i % len(CASES)]
        t0 = time.perf_counter()
        score = reward(completion, record)
        warm.append(time.perf_counter() - t0)
        assert score == expected, (completion, score)
    warm_s = statistics.median(warm)
    print(f'first call (starts the helper): {first_s:.3f} s')
    print(f'warm check, median of {args.calls}: {warm_s * 1e3:.2f} ms')
    print(f'helper start-up (first - warm): {first_s - warm_s:.3f} s')
    result = {'first_call_s': first_s, 'warm_check_s': warm_s, 'startup_s': first_s - warm_s}
    print(json.dumps(result))
    return result


if __name__ == '__main__':
    main()
