"""Trainer-side parsing of test programs from several threads at once.

``CodeReward`` reads a batch's tests in ``batch_workers`` threads. On CPython 3.11 two
overlapping ``ast.parse`` calls can fail with ``SystemError: AST constructor recursion depth
mismatch`` when the garbage collector runs a finalizer mid-conversion and the interpreter
switches threads there (it failed ``test_all_of_humaneval_as_published`` once in a coverage
run). ``parse_stress.py`` reproduces it in a fresh interpreter: four threads parse while a
fifth makes garbage whose finalizers run Python code, with a short thread switch interval.
"""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gepo_xtuner.reward.sandbox import trainer_tests
from gepo_xtuner.reward.sandbox.trainer_tests import parse_python

PACKAGE = Path(__file__).resolve().parents[2] / 'gepo_xtuner'
STRESS = Path(__file__).with_name('parse_stress.py')
#: modules that run only inside the sandbox's own single-threaded processes
SANDBOX_CHILD_MODULES = {'reward/sandbox/harness.py', 'reward/sandbox/judge_side.py',
                         'reward/sandbox/solution_side.py'}


def test_parse_python_survives_the_stress_that_breaks_a_bare_parse():
    """In a fresh interpreter (no coverage tracer) a bare ``ast.parse`` breaks under the
    stress (else there is nothing to guard: skipped) and :func:`parse_python` survives the
    same stress; a parse that fails raises what ``ast.parse`` raises."""
    env = {k: v for k, v in os.environ.items() if not k.startswith('COV')}
    proc = subprocess.run([sys.executable, str(STRESS), trainer_tests.__file__], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    if not got['bare']:
        pytest.skip(f"ast.parse of Python {got['python']} survived the stress")
    assert 'SystemError: AST constructor recursion depth mismatch' in got['bare'][0], got
    assert got['locked'] == [], got
    program = 'def f(x):\n    assert g([x, (1, 2)]) == 3\n'
    assert ast.dump(parse_python(program)) == ast.dump(ast.parse(program))
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
