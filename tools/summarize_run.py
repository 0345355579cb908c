#!/usr/bin/env python
"""What changed in an RL run: per-domain reward and validation before / after, step time, tokens/s.

Usage::

    python tools/summarize_run.py WORK_DIR

Reads ``WORK_DIR/training_curves.json`` (the loop's metric history, written at the end of
a run by ``TrainingCurvesHook``) and prints, per domain, the mean training reward of the
first and last steps, each validation metric at its first and last evaluation, and the
mean time per RL step and generated tokens per second (with its rollout share), and the
run-health alarms raised (``health/<alarm>/<domain>`` metrics of ``RunHealthHook``: the step
each started; the run's log has each alarm's full line).
"""

import argparse
import json
import math
import sys
from pathlib import Path


def mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return sum(values) / len(values) if values else float('nan')


def summarize(history: list[dict]) -> list[str]:
    """The summary lines of a run's metric history (one dict per step, validation at 0)."""
    steps = [row for row in history if 'time/step' in row]
    if not steps:
        raise ValueError('the history has no training step')
    half = max(1, len(steps) // 2)
    first, last = steps[:half], steps[-half:]
    lines = [f'steps: {len(steps)}; reward = mean over steps {int(first[0]["step"])}-'
             f'{int(first[-1]["step"])} -> {int(last[0]["step"])}-{int(last[-1]["step"])}']
    domains = sorted(k for k in {k for row in steps for k in row}
                     if k.startswith('reward/mean/'))
    for key in ['reward/mean', *domains]:
        lines.append(f'  {key:<28} {mean([r.get(key) for r in first]):.3f} -> '
                     f'{mean([r.get(key) for r in last]):.3f}')
    evals = [row for row in history if any(k.startswith('val/') for k in row)]
    if evals:
        lines.append(f'validation (step {int(evals[0]["step"])} -> {int(evals[-1]["step"])}, '
                     'greedy):')
        for key in sorted(k for k in evals[0] if k.startswith('val/')):
            before, after = evals[0][key], evals[-1].get(key, float('nan'))
            lines.append(f'  {key:<28} {before:.3f} -> {after:.3f}')
    tokens = sum(r.get('perf/gen_tokens', 0.0) for r in steps)
    rollout = sum(r.get('time/rollout', 0.0) for r in steps)
    lines.append(f'time per RL step: {mean([r["time/step"] for r in steps]):.1f} s '
                 f'(rollout {mean([r.get("time/rollout") for r in steps]):.1f} s, update '
                 f'{mean([r.get("time/update") for r in steps]):.1f} s)')
    if rollout > 0:
        lines.append(f'generated tokens/s: {tokens / rollout:.1f} ({int(tokens)} tokens in '
                     f'{rollout:.1f} s of rollout)')
    lines += alarm_lines(history)
    return lines


def alarm_lines(history: list[dict]) -> list[str]:
    """The alarms raised: one line per alarm, domain and step it started at."""
    watched = any(k.startswith('health/') for row in history for k in row)
    if not watched:
        return ['alarms: not watched (no RunHealthHook in the config)']
    started: list[tuple[int, str]] = []
    holding: set[str] = set()
    for row in history:
        now = {k for k, v in row.items()
               if k.startswith('health/') and k.count('/') == 2 and v and v == v}
        started += [(int(row['step']), k) for k in sorted(now - holding)]
        holding = now
    if not started:
        return ['alarms: none']
    lines = [f'alarms: {len(started)} (see the log for figures and what to try):']
    for step, key in started:
        _, alarm, domain = key.split('/')
        lines.append(f'  step {step:<5} {alarm} [{domain}]')
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('work_dir', help='the run\'s work directory')
    args = parser.parse_args(argv)
    path = Path(args.work_dir) / 'training_curves.json'
    if not path.is_file():
        print(f'error: {path} does not exist: the run did not finish (see its log)',
              file=sys.stderr)
        return 1
    history = json.loads(path.read_text())
    history = [{k: (float('nan') if v is None else v) for k, v in row.items()}
               for row in history]
    print('\n'.join(summarize(history)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
