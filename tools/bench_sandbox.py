"""Per-test overhead of the code sandbox, before and after file-system containment.

"Before" is the sandbox as it was at ``--before-rev`` (loaded from git into a temporary
package; network/PID containment only), "after" is the working tree's, at every
containment level available here. Each mechanism runs the same one-line stdin program
(``print(input())``), in interleaved rounds so that machine load affects all alike;
the median round is reported in ms per sandboxed test, with the ratio to the
before-default (the strongest level before: ``namespaces`` where available).

Usage:
    OMP_NUM_THREADS=1 .venv/bin/python tools/bench_sandbox.py [--runs 20] [--rounds 5]
"""

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gepo_xtuner.reward.sandbox import LEVELS, Sandbox, available_levels  # noqa: E402

#: The last revision of the sandbox without file-system containment.
BEFORE_REV = '5ee3c42'
FILES = ('sandbox.py', 'sandbox_harness.py')


def load_before(rev: str, where: Path):
    """The ``Sandbox`` class of ``rev`` (its two files copied into ``where``)."""
    pkg = where / 'sandbox_before'
    pkg.mkdir()
    (pkg / '__init__.py').write_text('')
    for name in FILES:
        text = subprocess.run(['git', 'show', f'{rev}:gepo_xtuner/reward/{name}'], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout
        (pkg / name).write_text(text)
    spec = importlib.util.spec_from_file_location('sandbox_before.sandbox', pkg / 'sandbox.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Sandbox


def time_runs(box, runs: int) -> float:
    """Milliseconds per run of a one-line stdin program."""
    start = time.perf_counter()
    for _ in range(runs):
        result = box.run('print(input())', stdin='x\n')
        assert result.status == 'ok' and result.stdout == 'x\n', result
    return (time.perf_counter() - start) / runs * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--runs', type=int, default=20, help='runs per mechanism and round')
    parser.add_argument('--rounds', type=int, default=5, help='interleaved rounds')
    parser.add_argument('--before-rev', default=BEFORE_REV,
                        help=f'git revision of the "before" sandbox (default {BEFORE_REV})')
    args = parser.parse_args()
    boxes = {}
    with tempfile.TemporaryDirectory() as tmp:
        before_cls = load_before(args.before_rev, Path(tmp))
        for level in ('unsafe_files', 'unsafe'):
            try:
                boxes[f'before {level}'] = before_cls(isolation=level)
            except Exception as exc:  # noqa: BLE001  (unavailable here)
                print(f'before {level}: unavailable ({exc})')
        why_not = available_levels()
        for level in reversed(LEVELS):
            if why_not[level] is None:
                boxes[f'after {level}'] = Sandbox(isolation=level)
            else:
                print(f'after {level}: unavailable ({why_not[level]})')
        times = {name: [] for name in boxes}
        for box in boxes.values():
            time_runs(box, 2)  # warm-up (page cache, probes)
        for _ in range(args.rounds):
            for name, box in boxes.items():
                times[name].append(time_runs(box, args.runs))
    base_name = next((n for n in ('before namespaces', 'before audit_hook') if n in times), None)
    base = statistics.median(times[base_name]) if base_name else float('nan')
    print(f'\n{"mechanism":<22} {"ms/test":>8} {"min..max":>14} {"ratio":>6}   '
          f'(median of {args.rounds} rounds x {args.runs} runs; ratio to {base_name})')
    for name, values in times.items():
        med = statistics.median(values)
        print(f'{name:<22} {med:8.1f} {min(values):6.1f}..{max(values):<6.1f} {med / base:6.2f}')


if __name__ == '__main__':
    main()
