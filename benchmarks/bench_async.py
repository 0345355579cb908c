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
* ``hf``: the in-process backend on the demo workload (``configs/gepo_tiny_cpu.py``:
  64 prompts x 8 responses, 20 new tokens at most). The synchronous loop at one thread,
  the synchronous loop at two threads (all the machine, in turn) and the overlapped loop
  at one thread per side (generation on the worker thread).

Usage::

    python benchmarks/bench_async.py                   # both setups, 2 rounds of 6 steps
    python benchmarks/bench_async.py --setup hf --steps 8 --rounds 3
    python benchmarks/bench_async.py --setup vllm      # needs make vllm-env
"""

import argparse
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
    import json
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
    return [r['time/step'] for r in timed]


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--setup', nargs='+', choices=('lmdeploy', 'vllm', 'hf'),
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
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix='bench_async_'))
    tiny = tiny_dir(a.tiny_dir, work)
    cpu = next((line.split(':', 1)[1].strip() for line in open('/proc/cpuinfo')
                if line.startswith('model name')), 'unknown CPU')
    print(f'machine: {cpu}, {os.cpu_count()} cores; model {tiny / "model"}; '
          f'{a.rounds} rounds x {a.steps} timed steps per variant')
    start = time.time()
    if 'lmdeploy' in a.setup:
        bench_lmdeploy(tiny, work, a.steps, a.rounds, a.lmdeploy_prompts, a.lmdeploy_new_tokens,
                       a.lmdeploy_epochs)
    if 'vllm' in a.setup:
        bench_vllm(tiny, work, a.steps, a.rounds, a.lmdeploy_prompts, a.lmdeploy_new_tokens,
                   a.lmdeploy_epochs, a.vllm_python)
    if 'hf' in a.setup:
        bench_hf(tiny, work, a.steps, a.rounds)
    print(f'total wall time {time.time() - start:.0f}s; load average '
          f'{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores')
    shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()
