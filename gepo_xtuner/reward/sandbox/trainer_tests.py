"""Reading an assert-form test program, in the trainer, before any run (trainer side).

Which names the tests expect from the solution (:func:`free_names`), which records cannot
be run against a solution in another process (:func:`unsupported_arguments`), and which
modules a program imports (:func:`imported_modules`): the test process may import those
and the standard library, and nothing the solution names (docs/rewards.md, "What the
grader trusts"). Never loaded inside the sandbox.
"""

import ast
import builtins
import threading

__all__ = ['free_names', 'imported_modules', 'parse_python', 'unsupported_arguments']

_PARSE_LOCK = threading.Lock()


def parse_python(source: str) -> ast.Module:
    """``ast.parse(source)``, one thread at a time: what every trainer-side parse uses.

    ``CodeReward`` reads a batch's tests in threads (``batch_workers``). CPython 3.11 keeps
    the depth of the tree ``ast.parse`` is converting to Python objects in state that all
    threads share; when the garbage collector runs a finalizer in the middle of that
    conversion and the interpreter switches threads there, a second thread's parse moves
    the depth under the first, which then fails with ``SystemError: AST constructor
    recursion depth mismatch`` (seen in a test run scoring HumanEval in 4 threads). The lock
    keeps this package's parses from overlapping; the stress test of
    tests/test_reward/test_parse_threads.py breaks a bare ``ast.parse`` on 3.11.7 and not on
    3.12.1 or 3.13.0.

    Raises:
        SyntaxError: ``source`` is not Python, as ``ast.parse`` raises it.
    """
    with _PARSE_LOCK:
        return ast.parse(source)


def _bound_and_loaded(tree) -> tuple[set[str], list[str]]:
    bound: set[str] = set()
    loaded: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded.append if isinstance(node.ctx, ast.Load) else bound.add)(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split('.')[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif isinstance(node, ast.MatchAs) and node.name:
            bound.add(node.name)
    return bound, loaded


def free_names(program: str, keep_builtins: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Names ``program`` reads but never binds, in order of first use: the ones the
    solution is expected to define.

    Builtins are left out (a solution's ``set`` or ``abs`` must not replace the one the
    tests call), except those in ``keep_builtins`` (a reference solution that defines a
    function named like a builtin).

    Example:
        >>> free_names('import math\\nassert math.isclose(area(2), 12.57, rel_tol=0.01)')
        ('area',)
    """
    bound, loaded = _bound_and_loaded(parse_python(program))
    names = dict.fromkeys(n for n in loaded if n not in bound and (
        n in keep_builtins or not hasattr(builtins, n)))
    return tuple(names)


def unsupported_arguments(program: str, targets: set[str]) -> str | None:
    """Why ``program`` cannot run against a solution in another process, or None.

    Looks at every call of a name in ``targets`` (the solution's functions, and the
    parameter a HumanEval ``check`` receives them as): an argument that is a lambda, a
    generator expression, or a function or class the tests define cannot cross to the
    solution's process. (The test process refuses any other such value when it meets
    one, :class:`UnsupportedTest`; this finds the ones visible in the text before a run.)
    """
    tree = parse_python(program)
    own = {n.name for n in ast.walk(tree)
           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    own |= {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign)
            and isinstance(n.value, ast.Lambda) for t in n.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in targets):
            continue
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            arg = arg.value if isinstance(arg, ast.Starred) else arg
            kind = ('a lambda' if isinstance(arg, ast.Lambda) else
                    'a generator' if isinstance(arg, ast.GeneratorExp) else
                    f'the tests\' own {arg.id!r}' if isinstance(arg, ast.Name) and arg.id in own
                    else None)
            if kind is not None:
                return (f'line {node.lineno}: the tests pass {kind} to {node.func.id}(); only '
                        "builtin data and the solution's own objects can cross to the "
                        "solution's process, and the tests never run in the solution's")
    return None


def imported_modules(source: str) -> tuple[str, ...]:
    """Top-level modules ``source`` imports (absolute imports anywhere in it).

    Used for a HumanEval prompt, which both processes run (the test process as the
    tests' prelude, the solution's as part of the solution): the harness imports these
    before it forks, so that each process does not pay for them again.

    Example:
        >>> imported_modules('from typing import List\\nimport math, os.path')
        ('typing', 'math', 'os')
    """
    try:
        tree = parse_python(source)
    except SyntaxError:
        return ()
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name.split('.')[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module.split('.')[0])
    return tuple(dict.fromkeys(names))
