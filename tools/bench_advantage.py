#!/usr/bin/env python
"""Time advantage processors on synthetic batches at the paper's scale, on CPU.

Times, with warm-up and the median of repeats:
- ``GRPOAdvantage`` and ``GEPOAdvantage`` on the same batch (both read the padded
  logprobs: every processor reports group entropy, the quantity the paper plots
  for every method), and GRPO on rewards alone, for reference;
- the floor: a single reduction (``logprobs.sum()``) over the same logprob tensor.

Batches: B prompts x K responses, response lengths uniform in [1, T], float32
logprobs padded to T with a bool mask. The paper's scale is 256 x 16 with T = 4096.
The last line is ``ratio_gepo_over_grpo=<float> ratio_gepo_over_floor=<float>`` for
the paper-scale batch.

Usage::

    python tools/bench_advantage.py [--repeats 45] [--threads N]
"""

import argparse
import statistics
import time

import torch

import gepo_xtuner  # noqa: F401
from gepo_xtuner.advantage import AdvantageInputs, encode_domains
from gepo_xtuner.registry import ADVANTAGES

DOMAINS = ['math', 'physics', 'code', 'instruction_following']


def make_batch(prompts: int, k: int, max_len: int, seed: int = 0) -> AdvantageInputs:
    gen = torch.Generator().manual_seed(seed)
    n = prompts * k
    lengths = torch.randint(1, max_len + 1, (n, ), generator=gen)
    mask = torch.arange(max_len)[None, :] < lengths[:, None]
    # per-prompt entropy level, tokens' -logprob ~ Exponential(level)
    level = torch.rand(prompts, generator=gen).repeat_interleave(k)[:, None] * 0.8 + 0.2
    logprobs = torch.empty(n, max_len).exponential_(1.0, generator=gen).mul_(-level)
    p = torch.rand(prompts, generator=gen).repeat_interleave(k)
    rewards = (torch.rand(n, generator=gen) < p).float()
    domain_ids, names = encode_domains([DOMAINS[i // k % len(DOMAINS)] for i in range(n)])
    return AdvantageInputs(rewards=rewards, group_ids=torch.arange(n) // k, logprobs=logprobs,
                        mask=mask, domain_ids=domain_ids, domain_names=names)


def median_ms(fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def bench(prompts: int, k: int, max_len: int, repeats: int) -> dict[str, float]:
    batch = make_batch(prompts, k, max_len)
    rewards_only = AdvantageInputs(batch.rewards, batch.group_ids)
    grpo = ADVANTAGES.build(dict(type='GRPOAdvantage'))
    gepo = ADVANTAGES.build(dict(type='GEPOAdvantage'))
    state = gepo.init_state()
    # interleave the candidates so drift in machine load hits all of them alike
    results: dict[str, list[float]] = {k: [] for k in ('floor', 'grpo', 'gepo', 'grpo_rewards')}
    fns = dict(floor=lambda: batch.logprobs.sum(), grpo=lambda: grpo(batch),
               gepo=lambda: gepo(batch, state), grpo_rewards=lambda: grpo(rewards_only))
    for _ in range(3):
        for name, fn in fns.items():
            results[name].append(median_ms(fn, max(1, repeats // 3)))
    out = {name: statistics.median(v) for name, v in results.items()}
    tokens = int(batch.mask.sum())
    print(f'batch {prompts} prompts x {k} responses, T={max_len}: {prompts * k} responses, '
          f'{tokens / 1e6:.1f}M real tokens, logprobs {batch.logprobs.numel() * 4 / 2**20:.0f} MiB')
    for name, label in [('floor', 'floor: logprobs.sum()'), ('grpo', 'GRPOAdvantage'),
                        ('gepo', 'GEPOAdvantage'), ('grpo_rewards', 'GRPOAdvantage, rewards only')]:
        print(f'  {label:<30} {out[name]:9.2f} ms')
    print(f'  GEPO/GRPO {out["gepo"] / out["grpo"]:.3f}   GEPO/floor {out["gepo"] / out["floor"]:.3f}')
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--repeats', type=int, default=45)
    parser.add_argument('--threads', type=int, default=None, help='torch CPU threads')
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f'torch {torch.__version__}, {torch.get_num_threads()} CPU threads')
    bench(1024, 16, 2048, args.repeats)  # larger batch, shorter responses
    paper = bench(256, 16, 4096, args.repeats)
    print(f'ratio_gepo_over_grpo={paper["gepo"] / paper["grpo"]:.3f} '
          f'ratio_gepo_over_floor={paper["gepo"] / paper["floor"]:.3f}')


if __name__ == '__main__':
    main()
