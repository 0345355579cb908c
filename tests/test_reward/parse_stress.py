"""A stress for ``ast.parse`` in threads, run by tests/test_reward/test_parse_threads.py in a
fresh interpreter (no coverage tracer: under one, the threads crawl and the garbage piles up).

    python tests/test_reward/parse_stress.py gepo_xtuner/reward/sandbox/trainer_tests.py

Prints one JSON line: what four threads parsing at once raised, beside a fifth thread that
makes garbage whose finalizers run Python code, with a short thread switch interval; for a
bare ``ast.parse`` (``bare``) and for ``parse_python`` of the given file (``locked``), which
is loaded from its path alone (it imports only the standard library).
"""

import ast
import gc
import importlib.util
import json
import sys
import threading
from collections.abc import Callable

PROGRAM = 'def check(candidate):\n' + ''.join(
    f'    assert tuple(candidate([{i}, 2, 3])) == tuple(f([[1, [2, [3, ({i}, 4)]]]]))\n'
    for i in range(200))


class _Finalized:
    """Garbage in a reference cycle whose finalizer runs Python code (a thread switch point)."""

    def __del__(self) -> None:
        total = 0
        for i in range(50):
            total += i


def stress(parse: Callable[[str], object], threads: int = 4, parses: int = 20) -> list[str]:
    """``parse(PROGRAM)`` in ``threads`` threads beside a garbage maker; what they raised."""
    errors: list[str] = []
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            for _ in range(200):
                a, b = _Finalized(), _Finalized()
                a.other, b.other = b, a
            stop.wait(0.001)

    def work() -> None:
        for _ in range(parses):
            try:
                parse(PROGRAM)
            except Exception as exc:  # noqa: BLE001  (the SystemError, or anything else)
                errors.append(f'{type(exc).__name__}: {exc}')
                return

    sys.setswitchinterval(1e-5)
    gc.set_threshold(50, 5, 5)
    maker = threading.Thread(target=churn, daemon=True)
    workers = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
    maker.start()
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    maker.join()
    return errors


def main() -> None:
    spec = importlib.util.spec_from_file_location('trainer_tests', sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print(json.dumps({'python': sys.version.split()[0], 'bare': stress(ast.parse),
                      'locked': stress(module.parse_python)}))


if __name__ == '__main__':
    main()
