#!/usr/bin/env python
"""Write a deterministic sample rollout dump (the paper's four domain regimes) as JSONL.

Usage::

    python tools/make_sample_rollouts.py OUT.jsonl [--steps 5] [--prompts 16] [--k 16]
"""

import argparse
import json
from pathlib import Path

from gepo_xtuner.testbed.sample_rollouts import synthetic_rollouts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('out')
    parser.add_argument('--steps', type=int, default=5)
    parser.add_argument('--prompts', type=int, default=16, help='prompts per domain per step')
    parser.add_argument('--k', type=int, default=16, help='responses per prompt')
    parser.add_argument('--max-len', type=int, default=256)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with out.open('w', encoding='utf-8') as fh:
        for record in synthetic_rollouts(args.steps, args.prompts, args.k, args.max_len,
                                         args.seed):
            fh.write(json.dumps(record) + '\n')
            n += 1
    print(f'wrote {n} rollouts to {out}')


if __name__ == '__main__':
    main()
