"""Trainer-side parsing of test programs from several threads at once.

``CodeReward`` reads a batch's tests in ``batch_workers`` threads. On CPython 3.11 two
overlapping ``ast.parse`` calls can fail with ``SystemError: AST constructor recursion depth
mismatch`` when the garbage collector runs a finalizer mid-conversion and the interpreter
switches threads there (it failed ``test_all_of_humaneval_as_published`` once in a coverage
run). The stress below reproduces it: four threads parse while a fifth makes garbage whose
finalizers run Python code, with a short thread switch interval.
"""

import ast
import gc
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from gepo_xtuner.reward.sandbox.trainer_tests import parse_python

PACKAGE = Path(__file__).resolve().parents[2] / 'gepo_xtuner'
#: modules that run only inside the sandbox's own single-threaded processes
SANDBOX_CHILD_MODULES = {'reward/sandbox/harness.py', 'reward/sandbox/judge_side.py',
                         'reward/sandbox/solution_side.py'}
PROGRAM = 'def check(candidate):\n' + ''.join(
    f'    assert tuple(candidate([{i}, 2, 3])) == tuple(f([[1, [2, [3, ({i}, 4)]]]]))\n'
    for i in range(200))


class _Finalized:
    """Garbage in a reference cycle whose finalizer runs Python code (a thread switch point)."""

    def __del__(self) -> None:
        total = 0
        for i in range(50):
            total += i


def _stress(parse: Callable[[str], object], threads: int = 4, parses: int = 20) -> list[str]:
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

    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-5)
    gc.set_threshold(50, 5, 5)
    maker = threading.Thread(target=churn, daemon=True)
    workers = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
    try:
        maker.start()
        for t in workers:
            t.start()
        for t in workers:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in workers), 'a parsing thread ran past 120 s'
    finally:
        stop.set()
        maker.join(timeout=10)
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)
    return errors


def test_parse_python_survives_the_stress_that_breaks_a_bare_parse():
    """On this interpreter a bare ``ast.parse`` breaks under the stress (else there is
    nothing to guard: skipped); :func:`parse_python` survives the same stress, and a parse
    that fails raises what ``ast.parse`` raises."""
    bare = _stress(ast.parse)
    if not bare:
        pytest.skip(f'ast.parse of Python {sys.version.split()[0]} survived the stress')
    assert 'SystemError: AST constructor recursion depth mismatch' in bare[0], bare
    assert _stress(parse_python) == []
    assert ast.dump(parse_python(PROGRAM)) == ast.dump(ast.parse(PROGRAM))
    with pytest.raises(SyntaxError):
        parse_python('assert f(')


def _ast_parse_calls(tree: ast.AST, function: str = '<module>') -> list[str]:
    """The functions (innermost) in which ``tree`` calls ``ast.parse``, imports it from
    ``ast``, or compiles to an AST (``PyCF_ONLY_AST``): the ways to parse outside the lock."""
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += _ast_parse_calls(node, node.name)
            continue
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == 'parse' and isinstance(node.func.value, ast.Name)
                and node.func.value.id == 'ast'):
            found.append(function)
        elif isinstance(node, ast.ImportFrom) and node.module == 'ast' and any(
                a.name in ('parse', 'PyCF_ONLY_AST') for a in node.names):
            found.append(f'{function} (from ast import ...)')
        elif isinstance(node, ast.Attribute) and node.attr == 'PyCF_ONLY_AST':
            found.append(f'{function} (compile to an AST)')
        found += _ast_parse_calls(node, function)
    return found


def test_no_trainer_side_module_calls_ast_parse_but_through_parse_python():
    """Every ``ast.parse`` in the package outside the sandbox's own processes is
    :func:`parse_python`'s, so a new parse in a scoring thread cannot bring the error back."""
    found = []
    for path in sorted(PACKAGE.rglob('*.py')):
        rel = str(path.relative_to(PACKAGE))
        if rel not in SANDBOX_CHILD_MODULES:
            found += [f'{rel}: {f}' for f in _ast_parse_calls(ast.parse(path.read_text()))]
    assert found == ['reward/sandbox/trainer_tests.py: parse_python'], found
