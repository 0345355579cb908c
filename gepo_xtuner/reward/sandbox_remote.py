"""Assert-form tests in two processes: the solution serves calls, the tests alone judge.

Standard library only (loaded by :mod:`~gepo_xtuner.reward.sandbox_harness`, which runs
with ``python -I -S``). A published test program (MBPP's asserts, HumanEval's
``check(candidate)``) must call the solution, and when both share one interpreter the
solution can reach anything the tests hold: their frames, the builtins they compare with,
the descriptor their verdict goes to. So they never share one. The sandbox forks, before
the tests are read, into

* the **solution process**: runs the solution's code, then answers requests on a pipe
  (:func:`serve`). It has no report channel, has never held the tests, their nonce or a
  verdict, runs under a user id of its own (root trainers) and cannot signal, trace or
  read the test process (seccomp, :mod:`~gepo_xtuner.reward.sandbox_seccomp`);
* the **test process**: runs the test program with the solution's names bound to
  :class:`RemoteObject` proxies (:func:`run_tests`). Every call crosses the pipe as builtin
  data both ways (the contract of the call tests,
  :func:`~gepo_xtuner.reward.sandbox_harness.encode_value`); a value of any other type
  stays in the solution process and comes back as a proxy that refuses to be compared
  or tested for truth. The test process alone writes the verdict, made non-dumpable so
  that nothing of the same user can read or trace it.

What keeps its meaning across the pipe: return values (builtin data, exactly typed);
in-place changes of list, dict and set arguments (written back into the caller's
objects); exceptions the solution raises (re-raised as the nearest builtin exception
class, with the message); generators and other iterators (consumed lazily, item by item);
objects of the solution's classes (passed back and forth as proxies, their methods and
attributes reachable, never compared: :class:`RemoteObject`); helper functions defined by the tests or by a HumanEval prompt
(they run in the test process). What does not cross: a value of the tests' own that is
not builtin data (a lambda, an instance of a class the tests define) passed to the
solution: :class:`UnsupportedTest`, refused, never scored. A solution that dies, exits,
raises a ``BaseException`` that is not an ``Exception`` or breaks the protocol ends the run
with :class:`SolutionBroke`, which test code cannot catch as an ``Exception``.
"""

import builtins
import importlib
import json
import os
import sys

__all__ = ['Channel', 'RemoteObject', 'SolutionBroke', 'SolutionClient', 'UnsupportedTest',
           'decode_value', 'run_tests', 'serve']

#: Longest message accepted on the pipe (a return value of up to this many bytes of JSON).
MAX_MESSAGE_BYTES = 64 << 20
_MAX_ITEMS = 1 << 20
_MAX_DEPTH = 100


class SolutionBroke(BaseException):
    """The solution process died, exited or sent something that is not an answer.

    A ``BaseException`` (not an ``Exception``): a test's ``except Exception`` cannot
    turn it into a pass.
    """


class UnsupportedTest(BaseException):
    """The tests pass the solution a value that cannot cross the process boundary."""


class Channel:
    """One JSON object per line over a pair of pipe descriptors.

    Args:
        read_fd: descriptor to read messages from.
        write_fd: descriptor to write messages to.
    """

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._in = os.fdopen(read_fd, 'rb', buffering=1 << 16)
        self._out = write_fd

    def send(self, message: dict) -> None:
        data = (json.dumps(message, separators=(',', ':')) + '\n').encode()
        view = memoryview(data)
        while view:
            view = view[os.write(self._out, view):]

    def close(self) -> None:
        """Closes the reading end (the writing descriptor is the caller's)."""
        self._in.close()

    def recv(self) -> dict:
        """The next message.

        Raises:
            EOFError: the other side closed its end.
            ValueError: a line that is too long or not a JSON object.
        """
        line = self._in.readline(MAX_MESSAGE_BYTES + 1)
        if not line:
            raise EOFError('the pipe was closed')
        if not line.endswith(b'\n'):
            raise ValueError('a message longer than the limit, or cut off')
        message = json.loads(line)
        if type(message) is not dict:
            raise ValueError('a message that is not a JSON object')
        return message


# ------------------------------------------------------------------ values on the pipe

def _encode(value: object, ref) -> object:
    """Builtin data as typed JSON (tags as ``encode_value``); ``ref(v)`` for anything
    else: the solution side registers the object, the test side refuses or passes a
    proxy's id."""
    budget = [_MAX_ITEMS]

    def enc(v: object, depth: int) -> object:
        budget[0] -= 1
        if budget[0] < 0 or depth > _MAX_DEPTH:
            raise ValueError('a value too large or too deeply nested to pass between the '
                             'solution and the tests')
        t = type(v)
        if t in (type(None), bool, int, float, str):
            return v
        if t is list:
            return [enc(x, depth + 1) for x in v]
        if t is tuple:
            return {'__tuple__': [enc(x, depth + 1) for x in v]}
        if t is dict:
            return {'__dict__': [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]}
        if t in (set, frozenset):
            return {f'__{t.__name__}__': [enc(x, depth + 1) for x in v]}
        if t is bytes:
            return {'__bytes__': v.hex()}
        if t is complex:
            return {'__complex__': [v.real, v.imag]}
        return {'__ref__': ref(v)}
    return enc(value, 0)


#: Most values of equal hash a decoded set or dict may hold: more is refused (a set of
#: ints sharing one hash takes quadratic time to build, 18 s for 24,000 of them).
MAX_EQUAL_HASHES = 64


def _no_collisions(items: list) -> None:
    """Refuses keys of which too many share one hash (built in linear time or not at all).

    Raises:
        ValueError: more than :data:`MAX_EQUAL_HASHES` items share a hash, or an item is
            unhashable.
    """
    if len(items) <= MAX_EQUAL_HASHES:
        return
    counts: dict[int, int] = {}
    for item in items:
        h = hash(item)  # TypeError for an unhashable item: caught by the caller
        counts[h] = counts.get(h, 0) + 1  # the hashes themselves are ints of distinct value
        if counts[h] > MAX_EQUAL_HASHES:
            raise ValueError(f'more than {MAX_EQUAL_HASHES} items of a set or dict share a '
                             'hash (refused: they would take quadratic time to build)')


def _decode(data: object, ref=None) -> object:
    """The inverse of :func:`_encode`; ``ref(id)`` gives the object of a ``__ref__`` (None:
    a reference is refused).

    Bounded like :func:`_encode`: depth at most :data:`_MAX_DEPTH` (the same limit),
    at most :data:`_MAX_ITEMS` values in all, no set or dict with more than
    :data:`MAX_EQUAL_HASHES` keys of one hash. Anything else raises ``ValueError``, and
    only that: every other failure (a malformed tag body, an unhashable key, an integer
    too long for ``str``) is turned into one, so a caller that treats ``ValueError`` as a
    wrong answer never meets another exception from the data.

    Raises:
        ValueError: data that :func:`_encode` does not produce, or outside the bounds.
    """
    budget = [_MAX_ITEMS]

    def dec(d: object, depth: int) -> object:
        budget[0] -= 1
        if budget[0] < 0 or depth > _MAX_DEPTH:
            raise ValueError('a value too large or too deeply nested')
        t = type(d)
        if t in (type(None), bool, int, float, str):
            return d
        if t is list:
            return [dec(x, depth + 1) for x in d]
        if t is not dict or len(d) != 1:
            raise ValueError(f'not a value: {t.__name__}')
        (tag, body), = d.items()
        if tag == '__ref__':
            if type(body) is not int or ref is None:
                raise ValueError('a reference where none is expected')
            return ref(body)
        if tag == '__bytes__':
            if type(body) is not str:
                raise ValueError('bytes that are not hex text')
            return bytes.fromhex(body)
        if tag == '__complex__':
            if type(body) is not list or len(body) != 2 or any(
                    type(x) is not float for x in body):
                raise ValueError('a complex number that is not two floats')
            return complex(*body)
        if type(body) is not list:
            raise ValueError(f'{tag} without a list')
        if tag == '__tuple__':
            return tuple(dec(x, depth + 1) for x in body)
        if tag in ('__set__', '__frozenset__'):
            items = [dec(x, depth + 1) for x in body]
            _no_collisions(items)
            return set(items) if tag == '__set__' else frozenset(items)
        if tag == '__dict__':
            pairs = []
            for pair in body:
                if type(pair) is not list or len(pair) != 2:
                    raise ValueError('a dict item that is not a pair')
                pairs.append((dec(pair[0], depth + 1), dec(pair[1], depth + 1)))
            _no_collisions([k for k, _ in pairs])
            return dict(pairs)
        raise ValueError(f'unknown tag {tag!r}')
    try:
        return dec(data, 0)
    except (TypeError, RecursionError, MemoryError, OverflowError) as exc:
        raise ValueError(f'a value that cannot be rebuilt: {type(exc).__name__}: {exc}') from None


def decode_value(data: object) -> object:
    """A value that left the sandbox as typed JSON, rebuilt from builtin types only (run
    by the trusted parent: no references, the bounds of :func:`_decode`).

    Raises:
        ValueError: anything but what the harness's ``encode_value`` writes.
    """
    return _decode(data)


# ------------------------------------------------------------------- solution process

_MUTABLE = (list, dict, set)


def serve(namespace: dict, channel: Channel) -> None:
    """Answers the test process's requests until it closes the pipe (solution side).

    Requests (``op``): ``names`` (which of ``names`` the solution's module defines, and
    their values), ``call`` (``ref(*args, **kwargs)``; arguments that are lists, dicts
    or sets and changed come back as ``mutated``), ``getattr``, ``iter``, ``next``.
    Answers: ``{"value": ...}``,
    ``{"stop": true}`` (an exhausted iterator) or ``{"raise": [builtin class names of
    the exception's MRO], "message": str}``. An exception that is not an ``Exception``
    ends the process, as it would end the solution's own program.
    """
    objects: list[object] = []
    ids: dict[int, int] = {}

    def ref(obj: object) -> int:
        key = id(obj)
        if key not in ids:  # objects stay alive in ``objects``, so ids are not reused
            ids[key] = len(objects)
            objects.append(obj)
        return ids[key]

    def lookup(i: int) -> object:
        if type(i) is not int or not 0 <= i < len(objects):
            raise ValueError(f'no solution object {i!r}')
        return objects[i]

    def value(message: dict, key: str = 'ref') -> object:
        return _decode(message.get(key), lookup)

    while True:
        try:
            request = channel.recv()
        except EOFError:
            return
        op = request.get('op')
        try:
            mutated = []
            if op == 'names':
                result = {n: namespace[n] for n in request['names']
                          if type(n) is str and n in namespace}
                modules = {n: v.__name__ for n, v in result.items()
                           if isinstance(v, type(os)) and type(v.__name__) is str}
                channel.send({'value': _encode({n: v for n, v in result.items()
                                                if n not in modules}, ref),
                              'modules': modules})
                continue
            obj = lookup(request['ref'])
            if op == 'call':
                args = value(request, 'args')
                kwargs = value(request, 'kwargs')
                result = obj(*args, **kwargs)
                for where, arg in [*enumerate(args), *kwargs.items()]:
                    if type(arg) in _MUTABLE:
                        after = _encode(arg, ref)
                        sent = (request['args'][where] if type(where) is int
                                else _kwarg_sent(request['kwargs'], where))
                        if after != sent:
                            mutated.append([where, after])
            elif op == 'getattr':
                result = getattr(obj, request['name'])
            elif op == 'iter':
                result = iter(obj)
            elif op == 'next':
                try:
                    result = next(obj)
                except StopIteration:
                    channel.send({'stop': True})
                    continue
            else:
                raise ValueError(f'unknown request {op!r}')
            answer = {'value': _encode(result, ref)}
            if mutated:
                answer['mutated'] = mutated
        except Exception as exc:  # noqa: BLE001  (the solution's exception, reported)
            answer = {'raise': [c.__name__ for c in type(exc).__mro__
                                if c.__module__ == 'builtins'],
                      'message': _message(exc)}
        channel.send(answer)


def _kwarg_sent(kwargs: dict, name: str) -> object:
    for key, item in kwargs['__dict__']:
        if key == name:
            return item
    return None


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001  (a __str__ of the solution's that fails)
        return ''
    return (text if type(text) is str else '')[:10000]


# ----------------------------------------------------------------------- test process

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

    def __init__(self, channel: Channel, modules: frozenset[str] = frozenset()) -> None:
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
            return _encode(value, ref)
        except ValueError as exc:
            raise UnsupportedTest(str(exc)) from None

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
            if module.partition('.')[0] not in self._allowed:
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
            raise self._exception(answer)
        allowed = {'call': {'value', 'mutated'}, 'names': {'value', 'modules'}}.get(op, {'value'})
        if not {'value'} <= keys <= allowed:
            raise SolutionBroke(f'the solution process answered with {sorted(keys)}')
        self._modules = answer.get('modules', {})
        try:
            result = _decode(answer['value'], self._proxy)
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
            new = _decode(data, self._proxy)
            if type(target) is not type(new) or type(target) not in _MUTABLE:
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

    Returns:
        How many calls the tests made into the solution (0 proves nothing: the caller
        fails such a run).

    Raises:
        AssertionError or any exception of the tests: a failed test.
        SolutionBroke, UnsupportedTest: see the module docstring.
    """
    sys.set_int_max_str_digits(0)  # large integers cross the pipe as JSON numbers
    scope = {'__name__': '__main__', '__builtins__': builtins}
    if prelude:
        exec(compile(prelude, 'prompt.py', 'exec', optimize=0), scope)  # noqa: S102
    wanted = [n for n in names if n not in scope or n == entry_point]
    if entry_point is not None and entry_point not in wanted:
        wanted.append(entry_point)
    for name in wanted:
        scope.pop(name, None)  # a stub of the prompt's must not stand in for the solution
    scope.update(client.names(wanted))
    exec(compile(program, 'tests.py', 'exec', optimize=0), scope)  # noqa: S102
    return client.calls


# ---------------------------------------------------------- static reading (the parent)

def _bound_and_loaded(tree) -> tuple[set[str], list[str]]:
    import ast  # noqa: PLC0415  (the parent's work; the harness never needs it)
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
    import ast  # noqa: PLC0415
    bound, loaded = _bound_and_loaded(ast.parse(program))
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
    import ast  # noqa: PLC0415
    tree = ast.parse(program)
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
    import ast  # noqa: PLC0415
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ()
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name.split('.')[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module.split('.')[0])
    return tuple(dict.fromkeys(names))
