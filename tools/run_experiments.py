#!/usr/bin/env python
"""The paper's method comparison in miniature: a grid of methods x seeds, then tables and figures.

Usage::

    python tools/run_experiments.py [--methods gepo grpo ...] [--seeds 3] [--jobs 2]
        [--threads 1] [--steps N] [--work-dir work_dirs/experiments] [--report-dir DIR]
        [--tiny-dir work_dirs/tiny_cpu] [--cfg-options KEY=VALUE ...] [--report-only]

Every run is ``configs/experiments/<method>.py`` (the testbed of
``configs/_base_/tiny_cpu_grid.py`` plus one algorithm base) trained by xtuner's own entry
point, ``python -m xtuner.tools.train`` (what ``xtuner train`` runs), with ``--seed S``, in
``WORK_DIR/<method>/seed<S>/``. ``--jobs`` runs go at once, each limited to ``--threads``
threads (``OMP_NUM_THREADS`` and friends), so they do not fight over cores; on one thread a
run is also bitwise reproducible on the same machine.

Resumable: a run whose ``training_curves.json`` reaches the configured last step is skipped;
a run that was killed resumes from its last checkpoint (``--resume``, every 20 steps). The
report (``WORK_DIR/report/`` unless ``--report-dir``): ``results.md`` (Table 1 with mean ±
std over seeds and the verdict against GRPO, Table 2 for the ablations, curve and entropy
statistics), ``results.json``, ``fig3_validation.png``, ``fig4_policy_entropy.png`` and
``fig5_group_entropy.png`` (docs/experiments.md reads them).
"""

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gepo_xtuner.testbed.experiments import (load_history, plot_figures,  # noqa: E402
                                              results_markdown, summarize_run)

#: The paper's comparison (Table 1) and its ablations (Table 2), in table order.
METHODS = ('grpo', 'aepo', 'clip_cov', 'kl_cov', 'gepo', 'gepo_wo_low', 'gepo_wo_high',
           'gepo_symmetric')
CONFIG_DIR = ROOT / 'configs' / 'experiments'
#: The testbed's warm start: the default recipe of gepo_xtuner.testbed.tiny.warm_start, with a
#: share of each domain's demonstrations showing a systematic mistake (the answer reversed)
#: that the verifiable reward can train away: a learning signal RL can find within minutes.
WARM_START = dict(noise={'copy': 0.1, 'sort': 0.2, 'add': 0.3, 'mul': 0.4})
THREAD_VARS = ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS')
_PROGRESS = re.compile(r'Iter\(train\) \[\s*(\d+)/(\d+)\]')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--methods', nargs='+', default=list(METHODS),
                        help='configs/experiments/<method>.py to run (default: all eight)')
    parser.add_argument('--seeds', type=int, default=3, help='seeds 0..N-1 (default: 3)')
    parser.add_argument('--jobs', type=int, default=2,
                        help='runs at once (default: 2; one per core is the fastest)')
    parser.add_argument('--threads', type=int, default=1,
                        help='threads per run (default: 1: bitwise reproducible)')
    parser.add_argument('--steps', type=int, default=None,
                        help='RL steps per run (default: the config\'s train_cfg.max_steps)')
    parser.add_argument('--work-dir', type=Path, default=ROOT / 'work_dirs' / 'experiments',
                        help='runs go to WORK_DIR/<method>/seed<S>/ (default: %(default)s)')
    parser.add_argument('--report-dir', type=Path, default=None,
                        help='where results.md and the figures go (default: WORK_DIR/report)')
    parser.add_argument('--tiny-dir', type=Path, default=None,
                        help='a prepared policy and task files to use as they are (default: '
                             'the testbed\'s warm start, prepared and cached in '
                             'work_dirs/tiny_cpu_grid)')
    parser.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE',
                        help='passed to every run (e.g. smaller batches for a smoke test)')
    parser.add_argument('--report-only', action='store_true',
                        help='run nothing; report the finished runs found in WORK_DIR')
    return parser.parse_args(argv)


@dataclass
class Run:
    """One cell of the grid and its process."""

    method: str
    seed: int
    work_dir: Path
    steps: int
    proc: subprocess.Popen | None = None
    started: float = 0.0
    resumed_from: str | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.work_dir / 'run.log'

    @property
    def name(self) -> str:
        return f'{self.method}/seed{self.seed}'

    def finished(self) -> bool:
        """Whether the run's history reaches its last step (a complete, finished run)."""
        try:
            history = load_history(self.work_dir)
        except (OSError, ValueError):
            return False
        return bool(history) and int(history[-1]['step']) >= self.steps

    def checkpoint(self) -> str | None:
        """The checkpoint a killed run resumes from (mmengine's ``last_checkpoint``)."""
        pointer = self.work_dir / 'last_checkpoint'
        if not pointer.exists():
            return None
        path = Path(pointer.read_text().strip())
        return str(path) if path.exists() else None

    def steps_done(self) -> int:
        """The last step the run's log reports (0 before the first)."""
        try:
            found = _PROGRESS.findall(self.log.read_text(errors='replace')[-20000:])
        except OSError:
            return 0
        return int(found[-1][0]) if found else 0


def config_steps(method: str, cfg_options: list[str]) -> int:
    """``train_cfg.max_steps`` of a method's config after ``--cfg-options``."""
    from mmengine.config import Config, DictAction
    cfg = Config.fromfile(CONFIG_DIR / f'{method}.py')
    parsed = argparse.ArgumentParser()
    parsed.add_argument('--o', nargs='+', action=DictAction, default={})
    cfg.merge_from_dict(parsed.parse_args(['--o', *cfg_options]).o if cfg_options else {})
    return int(cfg.train_cfg.max_steps)


def ensure_tiny(tiny_dir: Path | None) -> tuple[Path, dict | None]:
    """The policy directory and its warm-start report (None for a model without one).

    Without ``tiny_dir``: the testbed's warm start (:data:`WARM_START`), trained once and
    cached in ``work_dirs/tiny_cpu_grid`` (what ``tools/prepare_tiny_cpu.py --out
    work_dirs/tiny_cpu_grid --noise copy=0.1 sort=0.2 add=0.3 mul=0.4`` writes).
    """
    from gepo_xtuner.testbed.tiny import read_warm_start_report, warm_start
    if tiny_dir is None:
        tiny_dir = ROOT / 'work_dirs' / 'tiny_cpu_grid'
        warm_start(tiny_dir, progress=lambda line: print(line, flush=True), **WARM_START)
    elif not (tiny_dir / 'model' / 'config.json').exists():
        raise SystemExit(f'--tiny-dir {tiny_dir} holds no model: prepare one with '
                         'tools/prepare_tiny_cpu.py --out DIR, or leave --tiny-dir out')
    report = tiny_dir / 'model' / 'warm_start.json'
    return tiny_dir, read_warm_start_report(tiny_dir / 'model') if report.exists() else None


def start(run: Run, args: argparse.Namespace) -> None:
    """Launches (or resumes) one run through xtuner's training entry point."""
    run.work_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GEPO_TINY_DIR=str(args.tiny_dir.resolve()),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                         os.environ.get('PYTHONPATH')])),
               **{v: str(args.threads) for v in THREAD_VARS})
    options = [f'train_cfg.max_steps={run.steps}', *args.cfg_options]
    cmd = [sys.executable, '-m', 'xtuner.tools.train', str(CONFIG_DIR / f'{run.method}.py'),
           '--work-dir', str(run.work_dir), '--seed', str(run.seed), '--cfg-options', *options]
    run.resumed_from = run.checkpoint()
    if run.resumed_from:
        cmd += ['--resume', run.resumed_from]
    with open(run.log, 'a') as log:  # the child keeps its own handle on the file
        log.write(f'\n# {time.strftime("%Y-%m-%d %H:%M:%S")}: {shlex.join(cmd)}\n')
        log.flush()
        run.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    run.started = time.time()


def _clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'


def run_grid(runs: list[Run], args: argparse.Namespace) -> list[Run]:
    """Runs the unfinished runs, ``args.jobs`` at once; returns the ones that failed."""
    todo = [r for r in runs if not r.finished()]
    skipped = len(runs) - len(todo)
    print(f'{len(runs)} runs: {skipped} already finished, {len(todo)} to run, '
          f'{args.jobs} at once, {args.threads} thread(s) each', flush=True)
    total_steps = sum(r.steps for r in todo)
    t0, active, failed, done_steps = time.time(), [], [], 0
    last_report = 0.0
    pending = list(todo)
    while pending or active:
        while pending and len(active) < args.jobs:
            run = pending.pop(0)
            start(run, args)
            resumed = f' (resuming {Path(run.resumed_from).name})' if run.resumed_from else ''
            print(f'[{_clock(time.time() - t0)}] start {run.name}{resumed}: {run.log}',
                  flush=True)
            active.append(run)
        time.sleep(1.0)
        for run in [r for r in active if r.proc.poll() is not None]:
            active.remove(run)
            done_steps += run.steps
            ok = run.proc.returncode == 0 and run.finished()
            if not ok:
                failed.append(run)
            print(f'[{_clock(time.time() - t0)}] {"done  " if ok else "FAILED"} {run.name} in '
                  f'{_clock(time.time() - run.started)}' + ('' if ok else f': see {run.log}'),
                  flush=True)
        now = time.time()
        if active and now - last_report >= 30:
            last_report = now
            progress = done_steps + sum(min(r.steps_done(), r.steps) for r in active)
            rate = progress / max(now - t0, 1e-9)
            eta = (total_steps - progress) / rate if rate > 0 else float('nan')
            print(f'[{_clock(now - t0)}] {progress}/{total_steps} steps, '
                  f'{len(todo) - len(pending) - len(active)}/{len(todo)} runs done, ETA '
                  + (_clock(eta) if eta == eta else '?'), flush=True)
    return failed


def report(runs: list[Run], args: argparse.Namespace, warm: dict, wall: float | None) -> Path:
    """Writes results.md, results.json and the three figures from the finished runs."""
    out = args.report_dir or args.work_dir / 'report'
    out.mkdir(parents=True, exist_ok=True)
    histories: dict[str, list[list[dict]]] = {}
    seeds: dict[str, list[int]] = {}
    for run in runs:
        if run.finished():
            histories.setdefault(run.method, []).append(load_history(run.work_dir))
            seeds.setdefault(run.method, []).append(run.seed)
    if not histories:
        raise SystemExit(f'no finished runs under {args.work_dir}: nothing to report')
    summaries = {m: [summarize_run(h) for h in hs] for m, hs in histories.items()}
    missing = [r.name for r in runs if not r.finished()]
    command = shlex.join(['python', 'tools/run_experiments.py', *sys.argv[1:]])
    header = [
        '# Method comparison on the built-in CPU testbed',
        '',
        f'- command: `{command}`',
        f'- runs: {sum(len(v) for v in histories.values())} finished of {len(runs)}'
        + (f' (missing: {", ".join(missing)})' if missing else ''),
        '- seeds per method: ' + ', '.join(f'{m} {seeds[m]}' for m in histories),
        f'- machine: {platform.machine()}, {os.cpu_count()} CPU cores, {args.jobs} runs at '
        f'once, {args.threads} thread(s) each; Python {platform.python_version()}',
    ]
    if warm:
        header.append('- warm start: greedy val accuracy '
                      + ', '.join(f'{d} {a:.3f}' for d, a in warm['val_accuracy'].items())
                      + f' ({warm["params"]["steps"]} supervised steps, seed '
                      f'{warm["params"]["seed"]})')
    if wall is not None:
        header.append(f'- wall time of this invocation: {_clock(wall)}')
    text = results_markdown(summaries, [m for m in args.methods], header='\n'.join(header))
    (out / 'results.md').write_text(text)
    (out / 'results.json').write_text(json.dumps(
        dict(command=command, seeds=seeds, runs=summaries), indent=1, default=str) + '\n')
    figures = plot_figures(histories, args.methods, out)
    print(f'report: {out / "results.md"}\n' + '\n'.join(f'figure: {p}' for p in figures),
          flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    unknown = [m for m in args.methods if not (CONFIG_DIR / f'{m}.py').exists()]
    if unknown:
        raise SystemExit(f'no config for {unknown} in {CONFIG_DIR}; choose from '
                         f'{sorted(p.stem for p in CONFIG_DIR.glob("*.py"))}')
    if args.seeds < 1 or args.jobs < 1 or args.threads < 1:
        raise SystemExit('--seeds, --jobs and --threads must be >= 1')
    steps = {m: args.steps or config_steps(m, args.cfg_options) for m in args.methods}
    # seed-major: an interrupted grid has every method at the same number of seeds
    runs = [Run(m, s, args.work_dir / m / f'seed{s}', steps[m])
            for s in range(args.seeds) for m in args.methods]
    args.tiny_dir, warm = ensure_tiny(args.tiny_dir)
    wall = None
    failed = []
    if not args.report_only:
        t0 = time.time()
        failed = run_grid(runs, args)
        wall = time.time() - t0
        print(f'grid finished in {_clock(wall)}' + (f'; {len(failed)} failed' if failed else ''),
              flush=True)
    report(runs, args, warm, wall)
    return 1 if failed else 0


if __name__ == '__main__':
    raise SystemExit(main())
