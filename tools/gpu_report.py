"""Prints the figures the GPU checks recorded: ``python tools/gpu_report.py [DIR]``.

``DIR`` (default ``work_dirs/gpu``) holds ``report.jsonl``, one JSON line per check
(``gepo_xtuner.testbed.gpu.record``); ``make test-gpu`` prints it after the tests.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from gepo_xtuner.testbed.gpu import format_report, read_report  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('dir', nargs='?', default='work_dirs/gpu')
    a = p.parse_args(argv)
    path = Path(a.dir) / 'report.jsonl'
    print(f'GPU figures ({path}):')
    print(format_report(read_report(path)))


if __name__ == '__main__':
    main()
