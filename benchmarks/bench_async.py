"""Whole-step time of the synchronous loop against generation one batch ahead.

Runs the same workload through ``xtuner train`` (its entry point, a process per run) with
``train_cfg.max_staleness=0`` and ``=1``, alternated in rounds, and reads each run's
logged ``time/step``. The first step of every run is left out (warm-up; with
``max_staleness=1`` it is also the one step generated in turn). Prints each variant's
median step and ``ratio_sync_over_async`` (steps per second of the overlapped loop over
the synchronous one: 2 is the limit when generation and update take the same time).

Setups (``--setup``):

* ``lmdeploy``: LMDeploy's own ``api_server`` (its code as shipped, with the CPU
  stand-in for its PyTorch engine, ``tests/test_rollout/lmdeploy_cpu_engine.py``) in a
  process pinned to core 0, the trainer pinned to core 1, one thread each; weights
  pushed over LMDeploy's weight-update-group protocol (gloo). The workload (16 prompts x
  8 responses of at most 20 tokens, 6 passes of one optimizer step over each batch) is
  sized so that generation and the update take about the same time; each run prints its
  median stage times to show it.
* ``vllm``: a real ``vllm serve`` (vLLM's CPU build from ``make vllm-env``, the command
  ``VLLMRolloutBackend`` launches) pinned to core 0 with its engine bound there, the
  trainer on core 1 at one thread; the lmdeploy setup's workload; weights pushed in place
  after every step through ``/dev/shm`` (``weight_sync`` mode ``'disk'``).
* ``longtail``: long-tailed response lengths through a real ``vllm serve`` (pinned to
  core 0 as in ``vllm``, the trainer on core 1, one thread each): an untrained tiny policy
  with 1024 positions, lengths imposed by
  :class:`~gepo_xtuner.testbed.longtail.LongTailVLLMBackend` (a benchmark device:
  log-normal per prompt, by default median 24, p99/p50 12, cap 384), 8 prompts x 4
  responses, 6 passes of one optimizer step per batch. Times ``sync`` (k=0), ``k1``
  (k=1), ``stream`` (k=2), ``stream_partial`` (k=2, ``partial_rollout=True``) and
  ``stream_partial_g4`` (the same, ``groups_in_flight=4``), ``stream_partial_k4_g4``
  (that with k=4), ``stream_partial_k4_g8`` and ``stream_partial_k8_g8`` (8 groups in
  flight, k=4 and 8), alternated in rounds; prints
  per variant the median and mean step, trained response tokens per second of wall time
  and the same from the variant's ideal step (:func:`_ideal`), the ratios
  (``ratio_<a>_over_<b>``), and the simulator (``benchmarks/async_sim.py``) calibrated on
  the same server (decode step against batch, prefill per token: a short pass before the
  runs) and runs (update against trained tokens, the median push): predicted against
  measured mean step per schedule.
* ``hf``: the in-process backend on the demo workload (``configs/gepo_tiny_cpu.py``:
  64 prompts x 8 responses, 20 new tokens at most). The synchronous loop at one thread,
  the synchronous loop at two threads (all the machine, in turn) and the overlapped loop
  at one thread per side (generation on the worker thread).

Usage::

    python benchmarks/bench_async.py                   # both setups, 2 rounds of 6 steps
    python benchmarks/bench_async.py --setup hf --steps 8 --rounds 3
    python benchmarks/bench_async.py --setup vllm      # needs make vllm-env
    python benchmarks/bench_async.py --setup longtail  # needs make vllm-env
"""

import argparse
import dataclasses
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing


def tiny_dir(arg: str | None, work: Path) -> Path:
    """The prepared demo model (``tools/prepare_tiny_cpu.py``), or an untrained one."""
    path = Path(arg or os.environ.get('GEPO_TINY_DIR', 'work_dirs/tiny_cpu')).resolve()
    if (path / 'model').is_dir():
        return path
    from gepo_xtuner.testbed.synthetic_tasks import build_task_files
    from gepo_xtuner.testbed.tiny import build_char_tokenizer, build_tiny_model
    path, tok = work / 'tiny_untrained', build_char_tokenizer()
    print(f'note: no model from tools/prepare_tiny_cpu.py; UNTRAINED weights in {path}')
    build_tiny_model(len(tok), seed=0).save_pretrained(path / 'model')
    tok.save_pretrained(path / 'model')
    build_task_files(path / 'data', n_train_per_domain=200, n_val_per_domain=4, seed=0)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def pinned(cores: str | None) -> list[str]:
    return ['taskset', '-c', cores] if cores and shutil.which('taskset') else []


def run(name: str, tiny: Path, work: Path, options: list[str], *, threads: int,
        cores: str | None = None, config: Path | None = None) -> list[float]:
    """One ``xtuner train`` run; its ``time/step`` of every step but the first."""
    return [r['time/step'] for r in run_rows(name, tiny, work, options, threads=threads,
                                             cores=cores, config=config)]


def run_rows(name: str, tiny: Path, work: Path, options: list[str], *, threads: int,
             cores: str | None = None, config: Path | None = None) -> list[dict]:
    """One ``xtuner train`` run; its logged scalars of every step but the first (one dict
    per step), after printing their median stage times."""
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, GEPO_TINY_DIR=str(tiny), OMP_NUM_THREADS=str(threads),
               PYTHONPATH=str(ROOT))
    cmd = pinned(cores) + [sys.executable, '-m', 'xtuner.tools.train',
                           str(config or ROOT / 'configs' / 'gepo_tiny_cpu.py'),
                           '--work-dir', str(out),
                           '--cfg-options', 'train_cfg.val=None',
                           'default_hooks.checkpoint.interval=100000', *options]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f'{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}')
    rows: dict[int, dict] = {}
    for path in out.glob('*/vis_data/scalars.json'):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if 'time/step' in row:
                rows[row['step']] = row
    timed = [rows[s] for s in sorted(rows)[1:]]
    stages = {k.removeprefix('time/'): statistics.median(r.get(k, 0.0) for r in timed)
              for k in sorted({k for r in timed for k in r if k.startswith('time/')})}
    print(f'  {name}: median stage seconds ' + ', '.join(f'{k} {v:.3f}'
                                                        for k, v in stages.items()))
    return timed


def report(times: dict[str, list[float]], sync: str, overlapped: str, what: str) -> None:
    for name, values in times.items():
        print(f'{what} {name:<16} median_s={statistics.median(values):.3f} '
              f'(min {min(values):.3f}, max {max(values):.3f}, {len(values)} steps)')
    ratio = statistics.median(times[sync]) / statistics.median(times[overlapped])
    print(f'{what} ratio_sync_over_async={ratio:.3f} ({sync} over {overlapped})')


def bench_hf(tiny: Path, work: Path, steps: int, rounds: int) -> None:
    common = [f'train_cfg.max_steps={steps + 1}']
    variants = {'sync_1thread': (common + ['train_cfg.max_staleness=0'], 1),
                'sync_2threads': (common + ['train_cfg.max_staleness=0'], 2),
                'async_1+1': (common + ['train_cfg.max_staleness=1'], 1)}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (options, threads) in variants.items():
            times[name] += run(f'hf_{name}', tiny, work, options, threads=threads)
    report(times, 'sync_2threads', 'async_1+1', 'hf')
    ratio = statistics.median(times['sync_1thread']) / statistics.median(times['async_1+1'])
    print(f'hf ratio_sync_over_async={ratio:.3f} (sync_1thread over async_1+1)')


def bench_lmdeploy(tiny: Path, work: Path, steps: int, rounds: int, batch: int,
                   new_tokens: int, epochs: int) -> None:
    port = free_port()
    log = open(work / 'server.log', 'w')
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS='1')
    server = subprocess.Popen(
        pinned('0') + [sys.executable, '-m', 'tests.test_rollout.lmdeploy_cpu_engine',
                       str(tiny / 'model'), '--server-port', str(port), '--logprobs-mode',
                       'raw_logprobs', '--max-batch-size', str(batch * 8)],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        from gepo_xtuner.rollout.server.pool import is_ready
        from gepo_xtuner.rollout.server.http import HTTPPool
        http = HTTPPool(f'http://127.0.0.1:{port}', 4, 10.0)
        deadline = time.time() + 180
        while not is_ready(http, 5.0)[0]:
            if server.poll() is not None or time.time() > deadline:
                raise SystemExit(f'the server did not start: {(work / "server.log").read_text()}')
            time.sleep(1)
        config = work / 'lmdeploy_cfg.py'
        config.write_text(
            f"_base_ = ['{ROOT / 'configs' / 'gepo_tiny_cpu.py'}']\n"
            "train_cfg = dict(rollout=dict(_delete_=True, type='LMDeployRolloutBackend', "
            f"server_url='http://127.0.0.1:{port}', timeout_s=600, max_retries=0, "
            "weight_sync=dict(mode='nccl', backend='gloo', timeout_s=600)))\n")
        common = [f'train_cfg.max_steps={steps + 1}', f'train_dataloader.batch_size={batch}',
                  f'train_cfg.sampling.max_new_tokens={new_tokens}',
                  f'train_cfg.minibatch_responses_per_rank={batch * 8}',
                  f'train_cfg.ppo_epochs={epochs}']
        times: dict[str, list[float]] = {'sync': [], 'async': []}
        for _ in range(rounds):
            for name, s in (('sync', 0), ('async', 1)):
                times[name] += run(f'lmdeploy_{name}', tiny, work,
                                   common + [f'train_cfg.max_staleness={s}'],
                                   threads=1, cores='1', config=config)
        report(times, 'sync', 'async', 'lmdeploy')
    finally:
        server.terminate()
        server.wait(60)
        log.close()


def bench_vllm(tiny: Path, work: Path, steps: int, rounds: int, batch: int,
                new_tokens: int, epochs: int, python: str) -> None:
    from gepo_xtuner.rollout.vllm.server import VLLMServerProcess
    port = free_port()
    spec = VLLMServerProcess(str(tiny / 'model'), port=port, python=python, max_model_len=128,
                             dtype='float32', kv_cache_gib=1, log_file=str(work / 'vllm.log'),
                             env={'VLLM_CPU_OMP_THREADS_BIND': '0'})
    server = VLLMServerProcess(str(tiny / 'model'), port=port, python=python,
                               log_file=str(work / 'vllm.log'), env=spec.env,
                               command=pinned('0') + spec.argv())
    server.start()
    try:
        config = work / 'vllm_cfg.py'
        config.write_text(
            f"_base_ = ['{ROOT / 'configs' / 'gepo_tiny_cpu.py'}']\n"
            "train_cfg = dict(rollout=dict(_delete_=True, type='VLLMRolloutBackend', "
            f"server_url='{server.url}', timeout_s=600, weight_sync=dict(mode='disk')))\n")
        common = [f'train_cfg.max_steps={steps + 1}', f'train_dataloader.batch_size={batch}',
                  f'train_cfg.sampling.max_new_tokens={new_tokens}',
                  f'train_cfg.minibatch_responses_per_rank={batch * 8}',
                  f'train_cfg.ppo_epochs={epochs}']
        times: dict[str, list[float]] = {'sync': [], 'async': []}
        for _ in range(rounds):
            for name, s in (('sync', 0), ('async', 1)):
                times[name] += run(f'vllm_{name}', tiny, work,
                                   common + [f'train_cfg.max_staleness={s}'],
                                   threads=1, cores='1', config=config)
        report(times, 'sync', 'async', 'vllm')
    finally:
        server.close()


LONGTAIL_VARIANTS = {  # name -> train_cfg options
    'sync': ['train_cfg.max_staleness=0'],
    'k1': ['train_cfg.max_staleness=1'],
    'stream': ['train_cfg.max_staleness=2'],
    'stream_partial': ['train_cfg.max_staleness=2', 'train_cfg.partial_rollout=True'],
    'stream_partial_g4': ['train_cfg.max_staleness=2', 'train_cfg.partial_rollout=True',
                          'train_cfg.groups_in_flight=4'],
    'stream_partial_k4_g4': ['train_cfg.max_staleness=4', 'train_cfg.partial_rollout=True',
                             'train_cfg.groups_in_flight=4'],
    'stream_partial_k4_g8': ['train_cfg.max_staleness=4', 'train_cfg.partial_rollout=True',
                             'train_cfg.groups_in_flight=8'],
    'stream_partial_k8_g8': ['train_cfg.max_staleness=8', 'train_cfg.partial_rollout=True',
                             'train_cfg.groups_in_flight=8'],
}


def _option(options: list[str], key: str, default: int) -> int:
    """The int value of ``train_cfg.<key>=...`` among a variant's options."""
    for option in options:
        if option.startswith(f'train_cfg.{key}='):
            return int(option.split('=', 1)[1])
    return default


def longtail_model(work: Path, max_len: int) -> Path:
    """An untrained tiny policy whose positions reach ``max_len``, with the task files
    (prompts only matter: the lengths are imposed)."""
    from gepo_xtuner.testbed.synthetic_tasks import build_task_files
    from gepo_xtuner.testbed.tiny import build_char_tokenizer, build_tiny_model
    path, tok = work / 'tiny_longtail', build_char_tokenizer()
    build_tiny_model(len(tok), seed=0, max_position_embeddings=max_len).save_pretrained(
        path / 'model')
    tok.save_pretrained(path / 'model')
    build_task_files(path / 'data', n_train_per_domain=200, n_val_per_domain=4, seed=0)
    return path


def decode_steps(url: str, prompt: list[int], batches: list[int], tokens: int
                 ) -> dict[int, float]:
    """Seconds per decode iteration of the server at each batch size: ``n=b`` responses
    of ``tokens`` tokens to one prompt (no stop), asked as the backend asks (sampled
    token's logprob and token ids returned: the logprob doubles a tiny model's iteration
    on this CPU), the faster of two tries, over ``tokens`` (the prefill, a few tokens, and
    the request's own overhead are left in)."""
    from gepo_xtuner.rollout.server.http import HTTPPool
    http = HTTPPool(url, 4, 600.0)
    out = {}

    def body(n: int) -> dict:
        return {'model': 'policy', 'prompt': prompt, 'n': n, 'max_tokens': tokens,
                'ignore_eos': True, 'temperature': 1.0, 'logprobs': 0,
                'return_token_ids': True}
    http.request('POST', '/v1/completions', json=body(max(batches)))  # warm-up
    for b in batches:
        best = float('inf')
        for _ in range(2):
            t = time.perf_counter()
            http.request('POST', '/v1/completions', json=body(b))
            best = min(best, time.perf_counter() - t)
        out[b] = best / tokens
    return out


def prefill_cost(url: str, prompt: list[int], long: int) -> float:
    """Seconds per prompt token of a lone prefill: one-token answers to ``prompt`` and to
    it repeated to ``long`` tokens, the difference over the extra tokens (the faster of
    three tries each; at least 0)."""
    from gepo_xtuner.rollout.server.http import HTTPPool
    http = HTTPPool(url, 4, 600.0)
    longer = (prompt * (long // len(prompt) + 1))[:long]
    times = []
    for ids in (prompt, longer):
        best = float('inf')
        for _ in range(3):
            t = time.perf_counter()
            http.request('POST', '/v1/completions', json={
                'model': 'policy', 'prompt': ids, 'max_tokens': 1, 'temperature': 1.0})
            best = min(best, time.perf_counter() - t)
        times.append(best)
    return max(times[1] - times[0], 0.0) / (len(longer) - len(prompt))


def bench_longtail(work: Path, a: argparse.Namespace) -> None:
    """Sync, one batch ahead, streaming and partial rollouts on imposed long-tailed lengths
    (:mod:`gepo_xtuner.testbed.longtail`) through a real ``vllm serve``; then the
    simulator (``benchmarks/async_sim.py``) calibrated on the same runs, against them."""
    import numpy as np

    from benchmarks import async_sim
    from gepo_xtuner.rollout.vllm.server import VLLMServerProcess
    from gepo_xtuner.data.prompts import encode_prompt
    from gepo_xtuner.testbed.longtail import target_length
    from gepo_xtuner.testbed.tiny import build_char_tokenizer
    B, K, cap = a.longtail_prompts, a.longtail_responses, a.longtail_cap
    tiny = longtail_model(work, 1024)
    # the lengths the prompts of the data set get (all of them, as the run encodes them)
    tok = build_char_tokenizer()
    ids = [encode_prompt(tok, json.loads(line), '{prompt}=')
           for line in (tiny / 'data' / 'train.jsonl').read_text().splitlines()]
    lengths = np.array([target_length(i, a.longtail_median, a.longtail_tail, cap) for i in ids])
    p50, p99 = np.percentile(lengths, [50, 99])
    print(f'longtail lengths: log-normal median {a.longtail_median:g}, p99/p50 '
          f'{a.longtail_tail:g}, cap {cap}; over the {len(ids)} prompts: p50 {p50:.0f}, '
          f'p99 {p99:.0f} (ratio {p99 / p50:.1f}), mean {lengths.mean():.1f}, max '
          f'{lengths.max()}; prompt length mean {np.mean([len(i) for i in ids]):.1f}')
    variants = {k: v for k, v in LONGTAIL_VARIANTS.items() if k in a.longtail_variants}
    port = free_port()
    spec = VLLMServerProcess(str(tiny / 'model'), port=port, python=a.vllm_python,
                             max_model_len=1024, dtype='float32', kv_cache_gib=1,
                             log_file=str(work / 'vllm.log'),
                             env={'VLLM_CPU_OMP_THREADS_BIND': '0'})
    server = VLLMServerProcess(str(tiny / 'model'), port=port, python=a.vllm_python,
                               log_file=str(work / 'vllm.log'), env=spec.env,
                               command=pinned('0') + spec.argv())
    server.start()
    print(f'longtail model {tiny / "model"} (untrained, max_position_embeddings 1024); '
          f'B={B} prompts x K={K}, ppo_epochs={a.longtail_epochs}')
    try:
        sizes = sorted({1, K, 4 * K, B * K})
        steps_s = decode_steps(server.url, ids[0], sizes, a.longtail_calib_tokens)
        prefill = prefill_cost(server.url, ids[0], 256)
        print('longtail decode_step_s ' + ', '.join(f'b={b}: {v * 1e3:.2f}ms'
                                                    for b, v in steps_s.items())
              + f'; prefill {prefill * 1e6:.1f}us per token')
        config = work / 'longtail_cfg.py'
        # request slots for every request a variant may have in flight: a cut group is
        # continued with one request per response (the stage warns with fewer)
        slots = max([16, B] + [_option(o, 'groups_in_flight', 1) * K for o in variants.values()])
        config.write_text(
            f"_base_ = ['{ROOT / 'configs' / 'gepo_tiny_cpu.py'}']\n"
            "custom_imports = dict(imports=['gepo_xtuner', 'gepo_xtuner.testbed.longtail'], "
            "allow_failed_imports=False)\n"
            "train_cfg = dict(rollout=dict(_delete_=True, type='LongTailVLLMBackend', "
            f"median={a.longtail_median}, tail={a.longtail_tail}, "
            f"server_url='{server.url}', timeout_s=600, max_concurrency={slots}, "
            "weight_sync=dict(mode='disk')))\n")
        common = [f'train_cfg.max_steps={a.steps + 1}', f'train_dataloader.batch_size={B}',
                  f'train_cfg.num_responses={K}', f'train_cfg.sampling.max_new_tokens={cap}',
                  f'train_cfg.minibatch_responses_per_rank={B * K}',
                  f'train_cfg.ppo_epochs={a.longtail_epochs}']
        rows: dict[str, list[dict]] = {name: [] for name in variants}
        for _ in range(a.rounds):
            for name, options in variants.items():
                rows[name] += run_rows(f'longtail_{name}', tiny, work, common + options,
                                       threads=1, cores='1', config=config)
        longtail_report(rows, steps_s, prefill, B, K, a, async_sim,
                        float(np.mean([len(i) for i in ids])))
    finally:
        server.close()


def _mean(rows: list[dict], key: str) -> float:
    return statistics.mean(r.get(key, 0.0) for r in rows)


def _ideal(name: str, row: dict, steps_s: dict[int, float], K: int) -> float:
    """The step ``row`` would take if the schedule ``name`` wasted nothing, from its own
    stage times: ``sync``: generate + update + push; ``k1``: max(generate, update) + push;
    streaming: max(generation work at the run's concurrency / throughput, update) + push,
    the throughput from the decode-step calibration at ``groups_in_flight * K`` sequences."""
    push, update = row.get('time/sync', 0.0), row.get('time/update', 0.0)
    gen = row.get('time/rollout_generate', row.get('time/rollout', 0.0))
    if name == 'sync':
        return gen + update + push
    if name == 'k1':
        return max(gen, update) + push
    g = _option(LONGTAIL_VARIANTS[name], 'groups_in_flight', 1)
    b = max([s for s in steps_s if s <= g * K] or [min(steps_s)])
    return max(row['perf/gen_tokens'] * steps_s[b] / b, update) + push


def longtail_report(rows: dict[str, list[dict]], steps_s: dict[int, float], prefill: float,
                    B: int, K: int, a: argparse.Namespace, async_sim, prompt_len: float
                    ) -> None:
    """Per variant: median and mean step, trained response tokens per second of wall time
    and the ideal's (:func:`_ideal`, summed over the same steps); the ratios; the
    simulator's mean step, calibrated on these runs, next to the measured mean step."""
    tps, ideal_tps = {}, {}
    for n, v in rows.items():
        tokens, wall = sum(r['perf/gen_tokens'] for r in v), sum(r['time/step'] for r in v)
        tps[n], ideal_tps[n] = tokens / wall, tokens / sum(_ideal(n, r, steps_s, K) for r in v)
        print(f"longtail {n:<18} median_step_s={statistics.median(r['time/step'] for r in v):.3f} "
              f"mean_step_s={wall / len(v):.3f} trained_tok_per_s={tps[n]:.1f} "
              f'ideal_tok_per_s={ideal_tps[n]:.1f} of_ideal={tps[n] / ideal_tps[n]:.2f} '
              f"gen_tokens={_mean(v, 'perf/gen_tokens'):.0f} "
              f"generate_s={_mean(v, 'time/rollout_generate') or _mean(v, 'time/rollout'):.3f} "
              f"update_s={_mean(v, 'time/update'):.3f} push_s={_mean(v, 'time/sync'):.3f} "
              f"pause_wait_s={_mean(v, 'time/rollout_pause_wait'):.3f} "
              f"token_staleness={_mean(v, 'rollout/token_staleness'):.2f} "
              f"partial_responses={_mean(v, 'rollout/partial_responses'):.1f} ({len(v)} steps)")
        print(f'longtail {n} steps_s ' + ' '.join(f"{r['time/step']:.2f}" for r in v))
    for n in rows:
        for d in ('sync', 'k1'):
            if n != d and d in rows:
                print(f'longtail ratio_{n}_over_{d}={tps[n] / tps[d]:.3f} (trained tokens/s; '
                      f'ideal {ideal_tps[n] / ideal_tps[d]:.3f})')
    # the simulator, calibrated on the same runs: decode steps from the calibration pass,
    # the update's line through every step's (trained tokens, seconds), the median push
    every = [r for v in rows.values() for r in v]
    points = {r['perf/gen_tokens'] + prompt_len * B * K: r.get('time/update', 0.0)
              for r in every}
    push = statistics.median(r.get('time/sync', 0.0) for r in every)
    eng, tr = async_sim.calibrate({'decode_step_s': steps_s, 'train_s': points, 'ranks': 1,
                                   'push_s': push, 'max_running': 256, 'p': prefill})
    errors = []
    for n, v in rows.items():
        options = LONGTAIL_VARIANTS[n]
        w = async_sim.Workload(servers=1, prompts=B, responses=K, steps=30, warmup=2,
                               prompt_len=round(prompt_len), lengths='lognormal_group',
                               median=a.longtail_median, tail=a.longtail_tail,
                               max_new_tokens=a.longtail_cap,
                               max_staleness=max(2, _option(options, 'max_staleness', 0)),
                               inflight_groups=_option(options, 'groups_in_flight', 1))
        schedule = {0: 'sync', 1: 'k1'}.get(
            _option(options, 'max_staleness', 0),
            'stream_partial' if 'train_cfg.partial_rollout=True' in options else 'stream')
        pred = statistics.mean(async_sim.predict(eng, tr, dataclasses.replace(w, seed=s),
                                                 (schedule, ))[schedule] for s in range(4))
        meas, med = _mean(v, 'time/step'), statistics.median(r['time/step'] for r in v)
        errors.append(abs(pred - meas) / meas)
        print(f'longtail sim {n:<18} predicted_step_s={pred:.3f} measured_step_s={meas:.3f} '
              f'error={100 * (pred - meas) / meas:+.1f}% (against the median step '
              f'{med:.3f}: {100 * (pred - med) / med:+.1f}%)')
    print(f'longtail sim calibrated a={eng.a * 1e3:.3f}ms c={eng.c * 1e3:.4f}ms '
          f'p={eng.p * 1e6:.1f}us '
          f't0={tr.t0:.3f}s t_tok={tr.t_tok * 1e3:.4f}ms push_s={tr.push_s:.3f}; '
          f'mean abs error {100 * statistics.mean(errors):.1f}%')


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--setup', nargs='+', choices=('lmdeploy', 'vllm', 'hf', 'longtail'),
                   default=['lmdeploy', 'hf'])
    p.add_argument('--vllm-python', default=str(ROOT / 'work_dirs' / 'vllm_env' / 'bin' / 'python'),
                   help='the interpreter of make vllm-env')
    p.add_argument('--steps', type=int, default=6, help='timed steps per run (after one)')
    p.add_argument('--rounds', type=int, default=2, help='alternated runs per variant')
    p.add_argument('--tiny-dir', help='default: $GEPO_TINY_DIR or work_dirs/tiny_cpu')
    p.add_argument('--lmdeploy-prompts', type=int, default=16,
                   help='B of the lmdeploy and vllm setups')
    p.add_argument('--lmdeploy-new-tokens', type=int, default=20)
    p.add_argument('--lmdeploy-epochs', type=int, default=6,
                   help='ppo_epochs of the lmdeploy setup: sizes the update to the generation')
    p.add_argument('--longtail-prompts', type=int, default=8, help='B of the longtail setup')
    p.add_argument('--longtail-responses', type=int, default=4, help='K of the longtail setup')
    p.add_argument('--longtail-median', type=float, default=24.0,
                   help='median imposed response length (tokens)')
    p.add_argument('--longtail-tail', type=float, default=12.0, help='p99 / p50 of the lengths')
    p.add_argument('--longtail-cap', type=int, default=384, help='max_new_tokens')
    p.add_argument('--longtail-epochs', type=int, default=6, help='ppo_epochs')
    p.add_argument('--longtail-calib-tokens', type=int, default=64,
                   help='tokens per decode-step calibration request')
    p.add_argument('--longtail-variants', nargs='+', default=list(LONGTAIL_VARIANTS),
                   choices=list(LONGTAIL_VARIANTS))
    p.add_argument('--keep-work', action='store_true',
                   help="keep the runs' work directories (each step's scalars) and print where")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix='bench_async_'))
    tiny = tiny_dir(a.tiny_dir, work) if set(a.setup) - {'longtail'} else None
    cpu = next((line.split(':', 1)[1].strip() for line in open('/proc/cpuinfo')
                if line.startswith('model name')), 'unknown CPU')
    print(f'machine: {cpu}, {os.cpu_count()} cores; '
          + (f'model {tiny / "model"}; ' if tiny else '')
          + f'{a.rounds} rounds x {a.steps} timed steps per variant; load average '
          f'{os.getloadavg()[0]:.2f} at the start')
    start = time.time()
    if 'lmdeploy' in a.setup:
        bench_lmdeploy(tiny, work, a.steps, a.rounds, a.lmdeploy_prompts, a.lmdeploy_new_tokens,
                       a.lmdeploy_epochs)
    if 'vllm' in a.setup:
        bench_vllm(tiny, work, a.steps, a.rounds, a.lmdeploy_prompts, a.lmdeploy_new_tokens,
                   a.lmdeploy_epochs, a.vllm_python)
    if 'longtail' in a.setup:
        bench_longtail(work, a)
    if 'hf' in a.setup:
        bench_hf(tiny, work, a.steps, a.rounds)
    print(f'total wall time {time.time() - start:.0f}s; load average '
          f'{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores')
    if a.keep_work:
        print(f'work directories kept in {work}')
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()
