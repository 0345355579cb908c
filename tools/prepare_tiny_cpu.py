#!/usr/bin/env python
"""Prepare the download-free CPU default: synthetic task files and a warm-started tiny policy.

Usage::

    python tools/prepare_tiny_cpu.py [--out work_dirs/tiny_cpu] [--seed 0] [--force]

Writes ``OUT/data/{train,val}.jsonl`` and ``OUT/model/`` (a Hugging Face model and
tokenizer directory, plus ``warm_start.json``). A second run with the same
arguments reuses the cached model; ``--force`` retrains. Prints the per-domain
greedy validation accuracy after the warm start and the paths to use in configs.
"""

import argparse
import time
from pathlib import Path

from gepo_xtuner.testbed.tiny import read_warm_start_report, warm_start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', type=Path, default=Path('work_dirs/tiny_cpu'),
                        help='output directory (default: %(default)s)')
    parser.add_argument('--seed', type=int, default=0, help='seed of data, init and batches')
    parser.add_argument('--force', action='store_true', help='retrain even if cached')
    # Smaller values are for smoke tests; the defaults are the tuned CPU recipe.
    parser.add_argument('--steps', type=int, default=None, help='override warm-start steps')
    parser.add_argument('--n-sft', type=int, default=None,
                        help='warm-start records per domain')
    parser.add_argument('--n-train', type=int, default=None, help='RL records per domain')
    parser.add_argument('--n-val', type=int, default=None, help='val records per domain')
    parser.add_argument('--noise', nargs='+', default=[], metavar='DOMAIN=SHARE',
                        help='share of a domain\'s warm-start answers that demonstrate a '
                             'systematic mistake (reversed), e.g. add=0.3 mul=0.4')
    return parser.parse_args(argv)


def parse_noise(items: list[str]) -> dict[str, float] | None:
    """``['add=0.3', 'mul=0.4']`` -> ``{'add': 0.3, 'mul': 0.4}`` (None for none)."""
    noise = {}
    for item in items:
        domain, sep, share = item.partition('=')
        try:
            noise[domain] = float(share)
        except ValueError:
            sep = ''
        if not sep:
            raise SystemExit(f'--noise takes DOMAIN=SHARE items, got {item!r}')
    return noise or None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = {k: v for k, v in dict(steps=args.steps, n_sft_per_domain=args.n_sft,
                                       n_train_per_domain=args.n_train,
                                       n_val_per_domain=args.n_val,
                                       noise=parse_noise(args.noise)).items()
                 if v is not None}
    start = time.time()
    model_dir = warm_start(args.out, seed=args.seed, force=args.force,
                           progress=lambda line: print(line, flush=True), **overrides)
    report = read_warm_start_report(model_dir)
    if report['trained_at'] < start:
        print(f'reused cached warm start from {time.ctime(report["trained_at"])} '
              f'(it took {report["train_seconds"]:.1f} s; --force retrains)')
    else:
        print(f'warm start took {report["train_seconds"]:.1f} s '
              f'({time.time() - start:.1f} s in all)')
    print('greedy val accuracy after warm start:')
    for domain, acc in report['val_accuracy'].items():
        print(f'  {domain:<6} {acc:.3f}')
    data_dir = model_dir.parent / 'data'
    print(f'model: {model_dir}')
    print(f'train: {data_dir / "train.jsonl"}')
    print(f'val:   {data_dir / "val.jsonl"}')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
