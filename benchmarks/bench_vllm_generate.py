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

Usage::

    python benchmarks/bench_vllm_generate.py                  # both workloads
    python benchmarks/bench_vllm_generate.py --workload tiny --repeats 5
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--workload', nargs='+', choices=('tiny', 'smollm2'),
                   default=['tiny', 'smollm2'])
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--threads', type=int, default=os.cpu_count() or 1)
    p.add_argument('--vllm-python', default=str(ROOT / 'work_dirs' / 'vllm_env' / 'bin' / 'python'),
                   help='the interpreter of make vllm-env')
    a = p.parse_args()
    cpu = next((line.split(':', 1)[1].strip() for line in open('/proc/cpuinfo')
                if line.startswith('model name')), 'unknown CPU')
    print(f'machine: {cpu}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}')
    for name in a.workload:
        bench(name, a.repeats, a.vllm_python, a.threads)
    print(f'load average after: {os.getloadavg()[0]:.2f}')


if __name__ == '__main__':
    main()
