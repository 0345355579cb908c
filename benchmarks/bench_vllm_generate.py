"""Generation throughput: a real ``vllm serve`` (vLLM's CPU build) against the in-process
backend, on the same prompts, sampling settings and weights.

Workloads (``--workload``):

* ``tiny``: the demo's (``configs/gepo_tiny_cpu.py``): 64 prompts of the warm-started tiny
  policy's task mix, K=8 responses, at most 20 new tokens, temperature 1.0.
* ``smollm2``: ``configs/gepo_smollm2_cpu.py``'s model (SmolLM2-135M-Instruct, float32) on
  GSM8K-style questions in its chat template: 8 prompts, K=4, at most 48 new tokens.

Each backend generates the batch once to warm up (vLLM's first request takes ~20 s), then
``--repeats`` times; the figure is response tokens (stop tokens included) over the median
wall time of one batch. The in-process backend runs in this process with all the cores
(``torch.set_num_threads``); the server runs alone (its engine bound to all the cores with
``VLLM_CPU_OMP_THREADS_BIND``), and the trainer process waits on it.

``--vs-direct`` measures the backend against the engine itself instead: on ONE server
(the tiny policy), the backend's ``generate(requests, params)`` against a direct batched
client (one ``POST /v1/completions`` whose ``prompt`` is the list of every prompt's token
ids, ``n=K``), for the demo's workload (64 prompts x K=8, 20 new tokens), a longer one
(64 x 8, 64 new tokens) and one with small groups (64 x K=2, 20 new tokens: one request
per prompt, 16 in flight, would leave the server 32 of the 128 sequences it runs at once).
The backend runs seeded (``sampling.seed``: one request per prompt) and unseeded (several
prompts per request beyond the request slots, ``max_batch_seqs``); the direct client asks
a seed too. All ask temperature 1 with ``ignore_eos`` and no stop token, so every response
has exactly ``max_new_tokens`` tokens and every side generates the same count; the sides
take turns, one batch each per round (after a warm-up round), so that a change of the
machine's load hits all of them. ``ratio_over_direct`` is a side's tokens/s over the
direct client's.

Usage::

    python benchmarks/bench_vllm_generate.py                  # both workloads
    python benchmarks/bench_vllm_generate.py --workload tiny --repeats 5
    python benchmarks/bench_vllm_generate.py --vs-direct --repeats 5
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing


def workload(name: str) -> tuple[Path, list[list[int]], dict, int]:
    """``(model_dir, prompt ids, sampling, max_model_len)`` of a workload."""
    from transformers import AutoTokenizer
    if name == 'tiny':
        root = Path(os.environ.get('GEPO_TINY_DIR', ROOT / 'work_dirs' / 'tiny_cpu'))
        tok = AutoTokenizer.from_pretrained(root / 'model')
        rows = [json.loads(line) for line in open(root / 'data' / 'train.jsonl')]
        rows = rows[::max(1, len(rows) // 64)][:64]  # every domain
        prompts = [tok(r['prompt'] + '=').input_ids for r in rows]
        return root / 'model', prompts, dict(n=8, max_new_tokens=20), 128
    root = Path(os.environ.get('GEPO_SMOLLM2_DIR', ROOT / 'work_dirs' / 'smollm2'))
    tok = AutoTokenizer.from_pretrained(root / 'model')
    rows = [json.loads(line) for line in open(root / 'data' / 'gsm8k_train.jsonl')][:8]
    prompts = [tok.apply_chat_template([{'role': 'user', 'content': r['question']}],
                                       add_generation_prompt=True, tokenize=True)
               for r in rows]
    prompts = [list(p['input_ids'] if isinstance(p, dict) else p) for p in prompts]
    return root / 'model', prompts, dict(n=4, max_new_tokens=48), 1024


def timed(backend, requests, params, repeats: int) -> tuple[float, int, float]:
    """``(median seconds, response tokens of one batch, warm-up seconds)``."""
    start = time.perf_counter()
    backend.generate(requests, params)
    warm = time.perf_counter() - start
    seconds, tokens = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        groups = backend.generate(requests, params)
        seconds.append(time.perf_counter() - start)
        tokens = sum(len(s.response_ids) for g in groups for s in g)
    return statistics.median(seconds), tokens, warm


def bench(name: str, repeats: int, python: str, threads: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gepo_xtuner.rollout import HFRolloutBackend, RolloutRequest, SamplingParams
    from gepo_xtuner.rollout.vllm import VLLMRolloutBackend
    model_dir, prompts, sampling, max_len = workload(name)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    params = SamplingParams(temperature=1.0, stop_token_ids=(tok.eos_token_id,), seed=0,
                            **sampling)
    requests = [RolloutRequest(p) for p in prompts]
    torch.set_num_threads(threads)
    hf = HFRolloutBackend()
    hf.attach(model, tok)
    hf_s, hf_tokens, _ = timed(hf, requests, params, repeats)
    log = Path(tempfile.mkdtemp(prefix='bench_vllm_')) / 'server.log'
    server = VLLMRolloutBackend(launch=dict(
        model_path=str(model_dir), python=python, port=0, max_model_len=max_len,
        dtype='float32', kv_cache_gib=2, log_file=str(log),
        env={'VLLM_CPU_OMP_THREADS_BIND': f'0-{threads - 1}' if threads > 1 else '0'}),
        weight_sync=dict(mode='none'))
    started = time.perf_counter()
    server.attach(model, tok)
    start_s = time.perf_counter() - started
    try:
        v_s, v_tokens, v_warm = timed(server, requests, params, repeats)
    finally:
        server.close()
    print(f'{name}: {len(prompts)} prompts x K={sampling["n"]}, <= {sampling["max_new_tokens"]} '
          f'new tokens, {threads} thread(s)')
    print(f'{name} in-process  tokens_per_s={hf_tokens / hf_s:9.1f}  ({hf_tokens} tokens in '
          f'{hf_s:.2f} s)')
    print(f'{name} vllm        tokens_per_s={v_tokens / v_s:9.1f}  ({v_tokens} tokens in '
          f'{v_s:.2f} s; server start {start_s:.0f} s, first batch {v_warm:.1f} s)')
    print(f'{name} ratio_vllm_over_in_process={(v_tokens / v_s) / (hf_tokens / hf_s):.2f}')


#: ``--vs-direct`` workloads on the tiny policy: name -> (prompts, K, new tokens)
DIRECT_WORKLOADS = {'demo': (64, 8, 20), 'long': (64, 8, 64), 'small_k': (64, 2, 20)}


def direct_generate(client, model: str, prompts: list[list[int]], n: int, max_tokens: int,
                    seed: int) -> int:
    """One batched ``/v1/completions`` request for every prompt; the response tokens."""
    resp = client.post('/v1/completions', json={
        'model': model, 'prompt': prompts, 'n': n, 'max_tokens': max_tokens,
        'temperature': 1.0, 'top_p': 1.0, 'top_k': -1, 'logprobs': 0, 'seed': seed,
        'return_token_ids': True, 'skip_special_tokens': False, 'ignore_eos': True})
    resp.raise_for_status()
    choices = resp.json()['choices']
    assert len(choices) == len(prompts) * n, len(choices)
    return sum(len(c['token_ids']) for c in choices)


def bench_vs_direct(repeats: int, python: str, threads: int, workloads: list[str],
                    slots: list[int] | None = None) -> None:
    """The backend's ``generate`` against a direct batched client on one server: seeded
    (one request per prompt) and unseeded (several prompts per request); with ``slots``,
    once per ``max_concurrency`` value (a backend each, on the same server), alternated."""
    import httpx
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gepo_xtuner.rollout import RolloutRequest, SamplingParams
    from gepo_xtuner.rollout.vllm import VLLMRolloutBackend
    model_dir, prompts, _, _ = workload('tiny')
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    max_len = max(len(p) for p in prompts) + max(t for _, _, t in DIRECT_WORKLOADS.values()) + 8
    log = Path(tempfile.mkdtemp(prefix='bench_vllm_')) / 'server.log'
    backend = VLLMRolloutBackend(launch=dict(
        model_path=str(model_dir), python=python, port=0, max_model_len=max_len,
        dtype='float32', kv_cache_gib=2, log_file=str(log),
        env={'VLLM_CPU_OMP_THREADS_BIND': f'0-{threads - 1}' if threads > 1 else '0'}),
        weight_sync=dict(mode='none'))
    started = time.perf_counter()
    backend.attach(model, tok)
    print(f'server start {time.perf_counter() - started:.0f} s (tiny policy, float32, '
          f'engine bound to {threads} core(s)); backend max_concurrency='
          f'{backend.max_concurrency}, max_batch_seqs={backend.max_batch_seqs}')
    client = httpx.Client(base_url=backend.url, timeout=600.0)  # kept alive across batches
    backends = {backend.max_concurrency: backend}
    for value in slots or ():
        if value not in backends:
            backends[value] = VLLMRolloutBackend(server_url=backend.url, max_concurrency=value,
                                                 weight_sync=dict(mode='none'))
            backends[value].attach(model, tok)
    label = (lambda b: '') if len(backends) == 1 else (lambda b: f' @{b.max_concurrency:<3}')
    try:
        for name in workloads:
            count, n, new = DIRECT_WORKLOADS[name]
            batch = (prompts * count)[:count]
            # ignore_eos with no stop token: every response is max_new_tokens long
            requests = [RolloutRequest(p, extra={'ignore_eos': True}) for p in batch]
            tokens = count * n * new
            sides = {}
            for b in backends.values():
                sides[f'backend seeded  {label(b)}'] = lambda r, b=b: b.generate(
                    requests, SamplingParams(n=n, temperature=1.0, max_new_tokens=new, seed=r))
                sides[f'backend unseeded{label(b)}'] = lambda r, b=b: b.generate(
                    requests, SamplingParams(n=n, temperature=1.0, max_new_tokens=new))
            sides['direct          '] = lambda r: direct_generate(
                client, backend.model_name, batch, n, new, r)
            seconds = {side: [] for side in sides}
            for r in range(repeats + 1):  # round 0 warms up
                for side, run in sides.items():  # one after the other: load drift hits all
                    start = time.perf_counter()
                    got = run(r)
                    took = time.perf_counter() - start
                    got = got if isinstance(got, int) else sum(
                        len(s.response_ids) for g in got for s in g)
                    assert got == tokens, (side, got, tokens)
                    if r:
                        seconds[side].append(took)
            print(f'{name}: {count} prompts x K={n}, {new} new tokens ({tokens} tokens a batch), '
                  f'median of {repeats}')
            direct = statistics.median(seconds['direct          '])
            for side, times in seconds.items():
                median = statistics.median(times)
                print(f'{name} {side} tokens_per_s={tokens / median:8.1f}  ({median:.2f} s; '
                      f'all {", ".join(f"{x:.2f}" for x in times)})'
                      + ('' if side.startswith('direct') else
                         f'  ratio_over_direct={direct / median:.2f}'))
    finally:
        client.close()
        for b in reversed(list(backends.values())):  # the launching backend last
            b.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--workload', nargs='+', choices=('tiny', 'smollm2'),
                   default=['tiny', 'smollm2'])
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--threads', type=int, default=os.cpu_count() or 1)
    p.add_argument('--vllm-python', default=str(ROOT / 'work_dirs' / 'vllm_env' / 'bin' / 'python'),
                   help='the interpreter of make vllm-env')
    p.add_argument('--vs-direct', action='store_true',
                   help='the backend against a direct batched client on one server')
    p.add_argument('--direct-workload', nargs='+', choices=tuple(DIRECT_WORKLOADS),
                   default=list(DIRECT_WORKLOADS), help='the --vs-direct workloads')
    p.add_argument('--slots', type=int, nargs='+',
                   help="--vs-direct: also the backend with these max_concurrency values")
    a = p.parse_args()
    cpu = next((line.split(':', 1)[1].strip() for line in open('/proc/cpuinfo')
                if line.startswith('model name')), 'unknown CPU')
    print(f'machine: {cpu}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}')
    print(f'date: {time.strftime("%Y-%m-%d %H:%M %Z")}')
    if a.vs_direct:
        bench_vs_direct(a.repeats, a.vllm_python, a.threads, a.direct_workload, a.slots)
    for name in [] if a.vs_direct else a.workload:
        bench(name, a.repeats, a.vllm_python, a.threads)
    print(f'load average after: {os.getloadavg()[0]:.2f}')


if __name__ == '__main__':
    main()
