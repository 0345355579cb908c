"""Where the test suite's time goes, from pytest's ``--durations=0`` report.

    .venv/bin/python -m pytest -m "not slow" --durations=0 ... > pytest.log
    python tools/test_durations.py pytest.log                 # tables (markdown)
    python tools/test_durations.py pytest.log --json tests/durations.json

The tables (slowest tests, each file's total) are those of docs/testing.md. ``--json`` writes
each file's total in seconds, which ``tests/conftest.py`` reads to start the longest files
first, so that no worker is left with a long file at the end of the run.

A test's time is its setup + call + teardown; a module-scoped fixture's setup is counted in
the first test that uses it, as pytest reports it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r'^\s*(\d+(?:\.\d+)?)s\s+(setup|call|teardown)\s+(\S+?)::(\S.*?)\s*$')


def parse(text: str) -> dict[tuple[str, str], float]:
    """Seconds per (file, test id), setup + call + teardown summed."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    for line in text.splitlines():
        match = LINE.match(line)
        if match:
            seconds, _, path, test = match.groups()
            out[(path, test)] += float(seconds)
    return dict(out)


def per_file(tests: dict[tuple[str, str], float]) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for (path, _), seconds in tests.items():
        totals[path] += seconds
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def tables(tests: dict[tuple[str, str], float], top: int) -> str:
    files = per_file(tests)
    total = sum(files.values())
    rows = ['| seconds | share | test |', '|---:|---:|---|']
    for (path, test), seconds in sorted(tests.items(), key=lambda kv: -kv[1])[:top]:
        rows.append(f'| {seconds:.1f} | {seconds / total:.1%} | `{path}::{test}` |')
    rows += ['', '| seconds | share | tests | file |', '|---:|---:|---:|---|']
    counts: dict[str, int] = defaultdict(int)
    for path, _ in tests:
        counts[path] += 1
    for path, seconds in files.items():
        rows.append(f'| {seconds:.1f} | {seconds / total:.1%} | {counts[path]} | `{path}` |')
    rows.append(f'\n{len(tests)} tests, {total:.0f} s of test time in all')
    return '\n'.join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('log', type=Path, help="pytest's output with --durations=0")
    parser.add_argument('--json', type=Path, help="write each file's seconds here")
    parser.add_argument('--top', type=int, default=30, help='slowest tests listed (30)')
    args = parser.parse_args(argv)
    tests = parse(args.log.read_text(errors='replace'))
    if not tests:
        print(f'{args.log}: no --durations lines (run pytest with --durations=0)',
              file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps(
            {path: round(s, 1) for path, s in per_file(tests).items()}, indent=1) + '\n')
    print(tables(tests, args.top))
    return 0


if __name__ == '__main__':
    sys.exit(main())
