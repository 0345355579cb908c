"""The judge's side of the sandbox: the test process of an assert-form run.

A published test program (MBPP's asserts, HumanEval's ``check(candidate)``) must call the
solution, and when both share one interpreter the solution can reach anything the tests
hold: their frames, the builtins they compare with, the descriptor their verdict goes
to. So they never share one. :mod:`.harness` forks, before the tests are read, into the
**solution process** (:mod:`.solution_side`: runs the code, then answers requests on a
pipe; no report channel, never held the tests, their nonce or a verdict; cannot signal,
trace or read this process, :mod:`.syscall_filter`) and this **test process**
(:func:`judge_process`), which runs the test program with the solution's names bound to
:class:`RemoteObject` proxies (:func:`run_tests`) and alone writes the verdict. Every call
crosses the pipe as builtin data both ways (:mod:`.wire`); a value of any other type stays
in the solution process and comes back as a proxy that refuses to be compared or tested
for truth.

Nothing the solution can shape runs here (docs/rewards.md, "What the grader trusts"):
the process imports only what the test program imports and the standard library (a
module the solution names is refused, :meth:`SolutionClient.names`), and it reads
nothing from a folder the solution can write: its HOME, TMPDIR and working directory are
its own, and with Landlock the kernel refuses it the solution's folder, ``/tmp`` and
``/dev/shm`` (:func:`judge_environment`). Standard library only (``python -I -S``).

What keeps its meaning across the pipe: return values (builtin data, exactly typed);
in-place changes of list, dict and set arguments (written back into the caller's
objects); exceptions the solution raises (re-raised as the nearest builtin exception
class, with the message); generators and other iterators (consumed lazily, item by item);
objects of the solution's classes (passed back and forth as proxies, their methods and
attributes reachable, never compared: :class:`RemoteObject`); helper functions defined
by the tests or by a HumanEval prompt (they run in the test process). What does not cross: a value of the tests' own that is
not builtin data (a lambda, an instance of a class the tests define) passed to the
solution: :class:`UnsupportedTest`, refused, never scored. A solution that dies, exits,
raises a ``BaseException`` that is not an ``Exception`` or breaks the protocol ends the run
with :class:`SolutionBroke`, which test code cannot catch as an ``Exception``.
"""

import builtins
import importlib
import json
import os
import signal
import sys

if __package__:  # imported by the trainer (gepo_xtuner.reward.sandbox)
    from . import limits
    from . import syscall_filter as seccomp
    from . import wire
else:  # loaded by the harness as a module beside it (python -I -S)
    import limits
    import syscall_filter as seccomp
    import wire

__all__ = ['JUDGE_HOME', 'ChecksFailed', 'RemoteObject', 'SolutionBroke', 'SolutionClient',
           'UnsupportedTest', 'every_check_runs', 'judge_process', 'run_tests']


class SolutionBroke(BaseException):
    """The solution process died, exited or sent something that is not an answer.

    A ``BaseException`` (not an ``Exception``): a test's ``except Exception`` cannot
    turn it into a pass.
    """


class UnsupportedTest(BaseException):
    """The tests pass the solution a value that cannot cross the process boundary."""


class SolutionClient:
    """The test process's end of the pipe: sends requests, checks and decodes answers.

    Everything that comes back is checked before use; anything but a well-formed answer
    raises :class:`SolutionBroke`. ``calls`` counts the calls made into the solution.

    Args:
        channel: the pipe to the solution process.
        modules: the top-level modules this process may import when the solution's
            module binds a name to one (decided by the trainer before the solution
            ran: what the test program and its prelude import, and the standard library);
            any other module the solution names is refused, never imported.
    """

    def __init__(self, channel: 'wire.Channel', modules: frozenset[str] = frozenset()) -> None:
        self._channel = channel
        self._allowed = modules
        self._proxies: dict[int, RemoteObject] = {}
        self._modules: object = {}
        self.calls = 0

    def _proxy(self, i: int) -> 'RemoteObject':
        if i not in self._proxies:
            self._proxies[i] = RemoteObject(self, i)
        return self._proxies[i]

    def encode(self, value: object) -> object:
        """A value of the tests as data for the pipe.

        Raises:
            UnsupportedTest: ``value`` holds something that is neither builtin data nor a
                proxy of the solution's.
        """
        def ref(v: object) -> int:
            if type(v) is RemoteObject and v._client is self:
                return v._id
            raise UnsupportedTest(
                f'the tests pass the solution a {type(v).__module__}.{type(v).__qualname__}; '
                'only builtin data (numbers, str, bytes, None, list, tuple, set, dict) and '
                "the solution's own objects can cross to the solution's process")
        try:
            return wire._encode(value, ref)
        except ValueError as exc:  # over the bounds: built from what the solution returned
            raise SolutionBroke(f'a value the tests pass the solution is over the bounds of '
                                f'what crosses the pipe: {exc}') from None

    def request(self, op: str, ref: int, **fields: object) -> object:
        """One request about the solution object ``ref``; its decoded value (or the
        solution's exception, raised here)."""
        return self._roundtrip({'op': op, 'ref': ref, **fields}, op)

    def call(self, ref: int, args: tuple, kwargs: dict) -> object:
        """``ref(*args, **kwargs)`` in the solution process; changes of list, dict and
        set arguments are written back into ``args`` / ``kwargs``."""
        self.calls += 1
        message = {'op': 'call', 'ref': ref, 'args': [self.encode(a) for a in args],
                   'kwargs': self.encode(dict(kwargs))}
        return self._roundtrip(message, 'call', (args, kwargs))

    def names(self, names: list[str]) -> dict:
        """The solution module's values of those of ``names`` it defines.

        A module the solution imported is imported here by its name (``import numpy
        as np`` gives this process's own ``numpy`` as ``np``), never proxied: the tests
        call library functions the solution could have patched in its process. Only a
        module of the allowed set (the constructor's ``modules``) is: importing runs
        the module's code in this process, and a module of the solution's choosing could
        read what the solution wrote (a cache under its home) while doing so.

        Raises:
            SolutionBroke: the answer is malformed, or names a module outside the set.
        """
        found = self._roundtrip({'op': 'names', 'names': list(names)}, 'names')
        if type(found) is not dict or not set(found) <= set(names):
            raise SolutionBroke('the solution process answered names it was not asked')
        modules = self._modules
        if type(modules) is not dict or not set(modules) <= set(names) - set(found):
            raise SolutionBroke('the solution process answered names it was not asked')
        for name, module in modules.items():
            if type(module) is not str or not all(p.isidentifier() for p in module.split('.')):
                raise SolutionBroke(f'the solution process named a module {module!r:.100}')
            parts = module.split('.')
            if parts[0] not in self._allowed or '__main__' in parts or parts[0] == 'test':
                raise SolutionBroke(
                    f'the solution binds {name!r} to the module {module!r:.100}, which the '
                    'tests do not import and the standard library does not have: refused '
                    '(the test process imports only what the test program imports and the '
                    'standard library)')
            try:
                found[name] = importlib.import_module(module)
            except ImportError:
                pass  # the tests' use of the name fails, as it would without the import
        return found

    def _roundtrip(self, message: dict, op: str, local: tuple = ((), {})) -> object:
        try:
            self._channel.send(message)
        except OSError as exc:
            raise SolutionBroke(f'the solution process is gone ({exc})') from None
        try:
            answer = self._channel.recv()
        except EOFError:
            raise SolutionBroke('the solution process ended during a call') from None
        except Exception as exc:  # noqa: BLE001  (malformed: the solution's doing)
            raise SolutionBroke(f'the solution process sent a malformed answer: {exc}') from None
        keys = set(answer)
        if op == 'next' and keys == {'stop'} and answer['stop'] is True:
            raise StopIteration
        if 'raise' in answer:
            exc = self._exception(answer)
            if isinstance(exc, (StopIteration, StopAsyncIteration)):
                # raised by a call it would end the tests' map/filter/iter early, quietly:
                # a generator's own StopIteration becomes RuntimeError likewise (PEP 479);
                # the end of an iteration crosses as {"stop": true}
                exc = RuntimeError(f'the solution raised {type(exc).__name__}')
            raise exc
        allowed = {'call': {'value', 'mutated'}, 'names': {'value', 'modules'}}.get(op, {'value'})
        if not {'value'} <= keys <= allowed:
            raise SolutionBroke(f'the solution process answered with {sorted(keys)}')
        self._modules = answer.get('modules', {})
        try:
            result = wire._decode(answer['value'], self._proxy)
            if 'mutated' in answer:
                self._write_back(answer['mutated'], *local)
        except (ValueError, TypeError, RecursionError, MemoryError) as exc:
            raise SolutionBroke(f'the solution process sent a malformed value: {exc}') from None
        return result

    def _exception(self, answer: dict) -> Exception:
        names, message = answer.get('raise'), answer.get('message')
        if type(names) is not list or type(message) is not str or set(answer) != {
                'raise', 'message'}:
            raise SolutionBroke('the solution process sent a malformed exception')
        for name in names:
            cls = getattr(builtins, name, None) if type(name) is str else None
            if isinstance(cls, type) and issubclass(cls, Exception):
                try:
                    return cls(message)
                except Exception:  # noqa: BLE001  (a class with another signature)
                    continue
        return Exception(message)

    def _write_back(self, mutated: object, args: tuple, kwargs: dict) -> None:
        """In-place changes of the call's arguments, applied to the tests' objects."""
        if type(mutated) is not list:
            raise ValueError('mutated is not a list')
        for item in mutated:
            if type(item) is not list or len(item) != 2:
                raise ValueError('a mutation that is not a pair')
            where, data = item
            target = (args[where] if type(where) is int and 0 <= where < len(args)
                      else kwargs.get(where) if type(where) is str else None)
            new = wire._decode(data, self._proxy)
            if type(target) is not type(new) or type(target) not in wire._MUTABLE:
                raise ValueError('a mutation of an argument that cannot change in place')
            if type(target) is list:
                target[:] = new
            else:
                target.clear()
                target.update(new)


class RemoteObject:
    """An object of the solution's, in the test process: calls, attributes and iteration
    go to the solution process, and what they give back is builtin data or another proxy.

    Nothing else does: it cannot be compared (``==``, ``<``, ...) or tested for truth
    (both raise ``TypeError``), and has no ``len``, ``in``, indexing or ``str`` of the
    solution's, so an object whose ``__eq__``, ``__bool__``, ``__contains__`` or
    ``__len__`` always agrees fails every assert it meets. Identity (``is``) and hashing
    are local; ``repr`` names the proxy.
    """

    __slots__ = ('_client', '_id')

    def __init__(self, client: SolutionClient, i: int) -> None:
        self._client, self._id = client, i

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._client.call(self._id, args, kwargs)

    def __getattr__(self, name: str) -> object:
        if name.startswith('__') and name.endswith('__'):
            raise AttributeError(name)  # copy/pickle protocols and the like stay local
        return self._client.request('getattr', self._id, name=name)

    def __iter__(self) -> 'RemoteObject':
        return self._client.request('iter', self._id)

    def __next__(self) -> object:
        return self._client.request('next', self._id)

    def __repr__(self) -> str:
        return f'<solution object {self._id}>'

    def _refuse(self, *_: object) -> bool:
        raise TypeError(f"{self!r} is not builtin data: the solution's own objects cannot be "
                        'compared or tested for truth (return numbers, str, list, tuple, '
                        'set or dict)')

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = _refuse
    __hash__ = object.__hash__


def stdlib_modules_used(program: str, names: list[str], entry_point: str | None) -> list[str]:
    """Those of ``names`` (the tests' free names) that are top-level standard-library
    modules the tests use only as ``name.attribute`` (never call, pass or rebind).

    >>> stdlib_modules_used('assert math.isclose(f(1), math.pi)', ['math', 'f'], None)
    ['math']
    >>> stdlib_modules_used('assert copy([1]) == [1]', ['copy'], None)  # the solution's
    []
    """
    import ast
    tree = ast.parse(program)
    bases = {id(node.value) for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)}
    seen: dict[str, bool] = {}  # name -> every use is an attribute base
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            seen[node.id] = seen.get(node.id, True) and id(node) in bases
    return [n for n in names if n != entry_point and n in sys.stdlib_module_names
            and seen.get(n, False)]


#: names the rewritten test program calls (bound in its scope by :func:`run_tests`)
FAILED_CHECK = '__gepo_failed_check__'
BOOL_OP = '__gepo_bool_op__'
ALL, ANY = '__gepo_all__', '__gepo_any__'
#: exception classes whose handlers make the asserts of their ``try`` the tests' own
#: business (a published test that expects or tolerates a failed assert): left as written
_CATCHING = frozenset({'AssertionError', 'Exception', 'BaseException'})


class ChecksFailed(AssertionError):
    """Checks of the test program failed (it ran to its end, every check judged)."""


def every_check_runs(program: str) -> 'ast.Module':
    """``program`` rewritten so that it runs to its end whatever the solution answers.

    A test program stops at its first failing assert, so the solution process would see,
    call by call, how far it got: one bit of the verdict per call. Rewritten:

    * each ``assert TEST, MSG`` is ``try: assert TEST`` / ``except Exception:
      __gepo_failed_check__()``: a false test, or an exception while evaluating it (the
      solution's own, re-raised here, or the tests' on what it returned), is recorded and
      the program goes on. ``MSG`` is dropped: it is evaluated only when the check fails
      (a message that calls the solution would tell it so) and never decides a verdict;
    * inside an assert's test, ``and`` / ``or`` evaluate every operand before combining
      them as Python does (:func:`bool_op`), and ``all(...)`` / ``any(...)`` consume their
      whole argument (:func:`all_checked`, :func:`any_checked`): short-circuiting would
      skip the calls after the first false (true) part, which shows where it was;
    * an assert inside a ``try`` whose handler catches ``AssertionError`` (or
      ``Exception``, ``BaseException``, everything), or inside a ``with`` of
      ``suppress``, is left as written: the tests handle its failure themselves.

    The calls the solution receives, their order and arguments, and when the run ends are
    then the same whether the checks hold or not; the verdict is decided after the program
    ended (:func:`run_tests`). A ``BaseException`` (the solution process died:
    :class:`SolutionBroke`) still ends it. What still ends a program early, or skips
    calls: a statement outside an assert that fails on a value the solution returned,
    a chained comparison (``a < f(x) < b``), and the tests' own control flow on the
    solution's values (docs/rewards.md, "What a solution learns from a run").
    """
    import ast

    def catches_failures(handler: ast.ExceptHandler) -> bool:
        kinds = handler.type
        if kinds is None:
            return True
        names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
        return any(isinstance(n, ast.Name) and n.id in _CATCHING or
                   isinstance(n, ast.Attribute) and n.attr in _CATCHING for n in names)

    def thunk(value: ast.expr) -> ast.Lambda:
        args = ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[],
                             kw_defaults=[], kwarg=None, defaults=[])
        return ast.Lambda(args, value)

    class EveryOperand(ast.NodeTransformer):
        """Inside an assert's test: no short-circuit skips a call."""

        def visit_BoolOp(self, node: ast.BoolOp) -> ast.Call:
            self.generic_visit(node)
            is_and = ast.Constant(isinstance(node.op, ast.And))
            return ast.copy_location(ast.Call(ast.Name(BOOL_OP, ast.Load()),
                                              [is_and, *map(thunk, node.values)], []), node)

        def visit_Call(self, node: ast.Call) -> ast.Call:
            self.generic_visit(node)
            if isinstance(node.func, ast.Name) and node.func.id in ('all', 'any') \
                    and len(node.args) == 1 and not node.keywords:
                node.func = ast.copy_location(
                    ast.Name(ALL if node.func.id == 'all' else ANY, ast.Load()), node.func)
            return node

        def visit_Lambda(self, node: ast.Lambda) -> ast.Lambda:
            return node  # a function the test defines: its body runs as written

    class Rewrite(ast.NodeTransformer):
        def __init__(self) -> None:
            self.handled = 0  # depth of try / with blocks that handle failures themselves

        def visit_Try(self, node: ast.Try) -> ast.Try:
            own = any(catches_failures(h) for h in node.handlers)
            self.handled += own
            node.body = [self.visit(n) for n in node.body]
            self.handled -= own
            node.handlers = [self.visit(h) for h in node.handlers]
            node.orelse = [self.visit(n) for n in node.orelse]
            node.finalbody = [self.visit(n) for n in node.finalbody]
            return node

        def visit_With(self, node: ast.With) -> ast.With:
            own = any('suppress' in ast.dump(item.context_expr) for item in node.items)
            self.handled += own
            self.generic_visit(node)
            self.handled -= own
            return node

        def visit_Assert(self, node: ast.Assert) -> ast.stmt:
            if self.handled:
                return node
            check = ast.Assert(EveryOperand().visit(node.test), None)
            report = ast.Expr(ast.Call(ast.Name(FAILED_CHECK, ast.Load()), [], []))
            handler = ast.ExceptHandler(ast.Name('Exception', ast.Load()), None, [report])
            return ast.copy_location(ast.Try([ast.copy_location(check, node)], [handler], [],
                                             []), node)

    tree = Rewrite().visit(ast.parse(program))
    return ast.fix_missing_locations(tree)


def bool_op(is_and: bool, *operands) -> object:
    """``a and b and ...`` (``is_and``) or ``a or b or ...`` over thunks, every one called
    first, then combined as Python does: the first false (true) value, else the last; an
    operand's exception is raised where evaluation would have reached it."""
    results = []
    for operand in operands:
        try:
            results.append((True, operand()))
        except Exception as exc:  # noqa: BLE001  (raised below if evaluation reaches it)
            results.append((False, exc))
    for ok, value in results[:-1]:
        if not ok:
            raise value
        if bool(value) != is_and:
            return value
    ok, value = results[-1]
    if not ok:
        raise value
    return value


def _consume(iterable) -> tuple[list, BaseException | None]:
    values, error = [], None
    try:
        for value in iterable:
            values.append(value)
    except Exception as exc:  # noqa: BLE001
        error = exc
    return values, error


def all_checked(iterable) -> bool:
    """``all(iterable)`` after consuming it whole (the calls its items make all happen)."""
    values, error = _consume(iterable)
    for value in values:
        if not value:
            return False
    if error is not None:
        raise error
    return True


def any_checked(iterable) -> bool:
    """``any(iterable)`` after consuming it whole."""
    values, error = _consume(iterable)
    for value in values:
        if value:
            return True
    if error is not None:
        raise error
    return False


def run_tests(client: SolutionClient, program: str, prelude: str, entry_point: str | None,
              names: list[str]) -> int:
    """Runs the test program against the solution process (test side).

    Args:
        client: the pipe to the solution process.
        program: the test program (MBPP's setup and asserts, HumanEval's ``check``
            followed by ``check(<entry_point>)``); it runs here, as published.
        prelude: trusted code run first in the same namespace (HumanEval's prompt: the
            helper functions its tests call), '' for none.
        entry_point: a name that is always the solution's, even where the prelude
            defines it (HumanEval's prompt ends with the function's signature).
        names: the names the program reads but does not define (found by the trusted
            parent); those the solution defines are bound to its values.

    Every check runs (:func:`every_check_runs`); the verdict comes after the program
    ended.

    Returns:
        How many calls the tests made into the solution (0 proves nothing: the caller
        fails such a run).

    Raises:
        ChecksFailed: one or more checks failed.
        Any other exception of the tests: a statement outside the checks failed.
        SolutionBroke, UnsupportedTest: see the module docstring.
    """
    sys.set_int_max_str_digits(0)  # large integers cross the pipe as JSON numbers
    scope = {'__name__': '__main__', '__builtins__': builtins}
    if prelude:
        exec(compile(prelude, 'prompt.py', 'exec', optimize=0), scope)  # noqa: S102
    wanted = [n for n in names if n not in scope or n == entry_point]
    if entry_point is not None and entry_point not in wanted:
        wanted.append(entry_point)
    # a standard-library module the tests use without importing it (MBPP's ``math.``,
    # relying on the solution's ``import math``) is imported here, never asked of the
    # solution: its own object under that name would run the tests' calls in its process
    for name in stdlib_modules_used(program, wanted, entry_point):
        scope[name] = importlib.import_module(name)
        wanted.remove(name)
    for name in wanted:
        scope.pop(name, None)  # a stub of the prompt's must not stand in for the solution
    scope.update(client.names(wanted))
    failed = [0]

    def record_failure() -> None:
        failed[0] += 1
    scope.update({FAILED_CHECK: record_failure, BOOL_OP: bool_op, ALL: all_checked,
                  ANY: any_checked})
    exec(compile(every_check_runs(program), 'tests.py', 'exec', optimize=0), scope)  # noqa: S102
    if failed[0]:
        raise ChecksFailed(f'{failed[0]} check(s) of the tests failed')
    return client.calls


#: The test process's home and temporary directory: a path that does not exist under a
#: root no run can write to, so that nothing a library looks for there (caches, config,
#: ``.pth`` files of a user site) can be the solution's.
JUDGE_HOME = '/nonexistent'
#: Variables the test process keeps from the run's environment (the trainer passes only
#: these and ``HOME`` / ``TMPDIR``, which point at the solution's folder).
_JUDGE_ENV_KEEP = ('PATH', 'LANG', 'LC_ALL', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS',
                   'MKL_NUM_THREADS')


_JUDGE_LANDLOCK = [False]  # whether the test process runs under its Landlock rules


def judge_environment(landlock: dict | None) -> None:
    """Gives the test process an environment of its own, before it reads anything.

    ``HOME`` and ``TMPDIR`` become :data:`JUDGE_HOME`, every other variable but
    :data:`_JUDGE_ENV_KEEP` goes, the working directory is ``/``; with Landlock
    (``landlock``: :func:`.limits.apply_landlock`'s rules, the system's and the interpreter's
    directories only) the kernel then refuses the process every read of the solution's
    folder, ``/tmp`` and ``/dev/shm`` and every write but ``/dev/null``. Without
    Landlock, :mod:`tempfile` is pointed at :data:`JUDGE_HOME` too (it would fall back to
    ``/tmp``, the solution's folder in a bubblewrap sandbox).
    """
    home = JUDGE_HOME
    kept = {k: os.environ[k] for k in _JUDGE_ENV_KEEP if k in os.environ}
    os.environ.clear()
    os.environ.update(kept, HOME=home, TMPDIR=JUDGE_HOME)
    os.chdir('/')
    if landlock is not None:
        limits.apply_landlock(**landlock)
        _JUDGE_LANDLOCK[0] = True
    else:
        import tempfile  # noqa: PLC0415  (only without Landlock: see above)
        tempfile.tempdir = JUDGE_HOME


#: Audit events whose first argument is a path the process reads or lists.
_TRACED_EVENTS = frozenset({'open', 'os.listdir', 'os.scandir', 'os.chdir', 'shutil.rmtree',
                            'os.getxattr', 'os.listxattr'})


def _trace_reads() -> list:
    """Records what this process opens, lists and imports from now on (diagnostics: the
    sandbox's ``trace_judge``; tests check that none of it is the solution's)."""
    seen: list = []

    def hook(event: str, args: tuple) -> None:
        if event == 'import' and args:
            seen.append(('import', str(args[0])))
        elif event in _TRACED_EVENTS and args and isinstance(args[0], (str, bytes)):
            path = os.path.join(os.getcwd(), os.fsdecode(args[0]))
            mode, flags = (tuple(args[1:3]) + (None, None))[:2] if event == 'open' else (
                None, None)
            write = bool((flags or 0) & limits.WRITE_FLAGS) or any(c in (mode or '') for c in 'wax+')
            seen.append((event, path, os.path.realpath(path), 'write' if write else 'read'))
    sys.addaudithook(hook)
    return seen


def _trace_report(seen: list) -> dict:
    """:func:`_trace_reads`'s record, and the name and file of every module loaded (an
    import through :mod:`importlib` raises no ``import`` event)."""
    files = sorted({f for m in list(sys.modules.values())
                    if isinstance(f := getattr(m, '__file__', None), str)})
    return {'events': [list(e) for e in seen[:100000]], 'module_files': files,
            'modules': sorted(sys.modules),
            'landlock': _JUDGE_LANDLOCK[0]}


def judge_process(spec: dict, control, channel: 'wire.Channel', solution_pid: int) -> None:
    """The test process of an assert run, after the fork: becomes the tests' uid (root
    trainers), gets an environment and a file-system view of its own
    (:func:`judge_environment`), takes the seccomp filter, reads the tests, waits for the
    solution process, runs them (:func:`run_tests`) and alone writes the verdict
    ``asserts-ok <nonce> <calls>`` (or ``unsupported <nonce> <reason as JSON>``) on
    ``control``.
    """
    trace = _trace_reads() if spec.get('trace_judge') else None
    if spec.get('drop_tests_to') is not None:
        uid, gid = spec['drop_tests_to']
        limits.drop_privileges(uid, gid, [])
        limits.set_dumpable(False)  # a change of credentials may reset it
    judge_environment(spec.get('judge_landlock'))
    if spec.get('seccomp'):
        seccomp.apply_filter()
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # no KeyboardInterrupt inside a test's try
    with os.fdopen(spec['tests_fd'], encoding='utf-8') as f:
        tests = json.load(f)
    try:
        hello = channel.recv()
    except (EOFError, ValueError):
        hello = None
    if hello != {'ready': True}:
        raise RuntimeError('the solution process failed before running the code')
    control.write('ready\n')
    control.flush()
    # only now may the solution's code run: nothing it does can keep this line from the
    # trainer (a judge it made fail before it would have been a reward error, not a 0)
    channel.send({'go': True})
    limits.last_steps(spec)
    client = SolutionClient(channel, frozenset(tests['modules']))
    nonce = tests['nonce']
    failure: BaseException | None = None
    try:
        calls = run_tests(client, tests['program'], tests['prelude'],
                                 tests['entry_point'], tests['names'])
    except UnsupportedTest as exc:
        control.write(f'unsupported {nonce} {json.dumps(str(exc))}\n')
        control.flush()
        os._exit(3)
    except Exception as exc:  # noqa: BLE001  (a failed test: reported after the solution ended)
        failure, calls = exc, client.calls
    finally:
        if trace is not None:  # before the verdict, and on a failure too
            control.write(f'judge-trace {json.dumps(_trace_report(trace))}\n')
            control.flush()
    # The solution's end is the same whatever the verdict: its pipe closes once the program
    # ran, and only then is the verdict written.
    let_solution_finish(solution_pid, channel, channel.write_fd)
    if failure is None and calls == 0:
        failure = AssertionError('the tests never called the solution')
    if failure is not None:
        raise failure
    control.write(f'asserts-ok {nonce} {calls}\n')
    control.flush()

def let_solution_finish(pid: int, channel: 'wire.Channel', write_fd: int,
                         wait_s: float = 1.0) -> None:
    """Closes the pipe, so the solution process ends, and waits for it a moment: the end
    of this process ends the sandbox (its PID namespace), and a solution process killed
    with it would lose what it printed (stderr and stdout, kept for diagnosis; the verdict
    is already written)."""
    import time  # noqa: PLC0415
    os.close(write_fd)
    channel.close()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG) != (0, 0):
                return
        except ChildProcessError:
            return
        time.sleep(0.002)
