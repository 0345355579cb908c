"""CPU benchmark: chunked ``gather_logprobs`` vs naive ``log_softmax(...).gather``.

Peak memory: each (variant, mode) makes one call in a fresh subprocess, and
``peak extra = ru_maxrss after the call - RSS just before it`` (the inputs are in
the baseline, the gradient is in the extra). Time: median of ``--repeats`` calls
after a warm-up, with the variants interleaved round-robin in one process so
that background load affects them alike.

Usage::

    python benchmarks/bench_token_ops.py [--rows 4096] [--vocab 32000] [--repeats 3]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a checkout without installing
MIB = 2**20


def _rss_bytes() -> int:
    """Current resident set size (Linux ``/proc``; falls back to the peak)."""
    try:
        with open('/proc/self/statm') as f:
            return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    except OSError:
        return _peak_rss_bytes()


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == 'darwin' else peak * 1024  # KiB on Linux


def make_inputs(rows: int, vocab: int):
    import torch
    gen = torch.Generator().manual_seed(0)
    return torch.randn(rows, vocab, generator=gen), torch.randint(0, vocab, (rows,), generator=gen)


def make_step(variant: str, logits, labels, backward: bool):
    """One call of ``naive`` or ``chunked<size>``; returns the detached output."""
    import torch

    from gepo_xtuner.ops.token import gather_logprobs

    def step():
        x = logits.detach().requires_grad_(backward)
        if variant.startswith('chunked'):
            size = variant[len('chunked'):]
            out = gather_logprobs(x, labels, chunk_size=None if size == 'auto' else int(size))
        else:
            out = torch.log_softmax(x, dim=-1).gather(-1, labels[:, None]).squeeze(-1)
        if backward:
            out.sum().backward()  # x.grad is freed with x
        return out.detach()

    return step


def memory_worker(variant: str, mode: str, rows: int, vocab: int) -> dict:
    """In a fresh process: peak RSS increase of the first call over the RSS before it."""
    logits, labels = make_inputs(rows, vocab)
    step = make_step(variant, logits, labels, mode == 'fwd+bwd')
    before = _rss_bytes()
    checksum = float(step().sum())
    return {'peak_extra_mib': (_peak_rss_bytes() - before) / MIB, 'checksum': checksum}


def time_variants(variants, mode: str, rows: int, vocab: int, repeats: int) -> dict:
    """Median seconds per call; variants are interleaved so that load hits all alike."""
    logits, labels = make_inputs(rows, vocab)
    steps = {v: make_step(v, logits, labels, mode == 'fwd+bwd') for v in variants}
    times = {v: [] for v in variants}
    for i in range(repeats + 1):  # the first round is a warm-up
        for v, step in steps.items():
            t0 = time.perf_counter()
            step()
            if i:
                times[v].append(time.perf_counter() - t0)
    return {v: statistics.median(t) for v, t in times.items()}


def run_memory(args, variant: str, mode: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), '--worker', variant, mode,
           '--rows', str(args.rows), '--vocab', str(args.vocab)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rows', type=int, default=4096, help='B*T')
    parser.add_argument('--vocab', type=int, default=32000)
    parser.add_argument('--chunk-size', default='auto',
                        help="rows per chunk in the last line; 'auto' = the library default")
    parser.add_argument('--extra-chunk-sizes', type=int, nargs='*', default=[1024])
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--worker', nargs=2, metavar=('VARIANT', 'MODE'), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(memory_worker(*args.worker, args.rows, args.vocab)))
        return

    import torch
    print(f'rows={args.rows} vocab={args.vocab} float32 logits={args.rows * args.vocab * 4 / MIB:.0f}'
          f' MiB threads={torch.get_num_threads()} repeats={args.repeats}')
    print('time: median per call, variants interleaved in one process; '
          'peak_extra: max RSS - RSS before the call, fresh process per variant')
    variants = ['naive', *(f'chunked{c}' for c in [args.chunk_size, *args.extra_chunk_sizes])]
    ratios = {}
    for mode in ('fwd', 'fwd+bwd'):
        mem = {v: run_memory(args, v, mode) for v in variants}
        times = time_variants(variants, mode, args.rows, args.vocab, args.repeats)
        ref = mem['naive']
        for v in variants:
            # all variants compute the same thing
            assert abs(mem[v]['checksum'] - ref['checksum']) <= 1e-4 * abs(ref['checksum']), mem
            ratios[mode, v] = (times[v] / times['naive'],
                               mem[v]['peak_extra_mib'] / ref['peak_extra_mib'])
            print(f'{mode:8s} {v:13s} time={times[v] * 1e3:7.1f} ms  '
                  f'peak_extra={mem[v]["peak_extra_mib"]:7.1f} MiB  chunked/naive: '
                  f'time={ratios[mode, v][0]:.3f} peak_mem={ratios[mode, v][1]:.3f}')
    t, m = ratios['fwd+bwd', variants[1]]
    print(f'(last line: fwd+bwd, chunk_size={args.chunk_size})')
    print(f'ratio_time_chunked_over_naive={t:.4f} ratio_peak_mem_chunked_over_naive={m:.4f}')


if __name__ == '__main__':
    main()
