"""The solution's side of the sandbox: the process that runs the untrusted code.

In every mode the solution runs in a process that has no report channel of an assert
run and never held its tests: :func:`solution_process` (an assert run's forked child:
becomes the run's uid, takes the seccomp filter that protects the test process, runs
the code, then answers the test process's requests, :func:`serve`); in stdin and call
mode, :mod:`.harness` runs the code itself after the same steps. At the ``unsafe*``
levels :func:`install_guard` adds a Python audit hook (not a security boundary).
Nothing here is trusted by the judge: see docs/rewards.md, "What the grader trusts".
Standard library only (``python -I -S``).
"""

import builtins
import os
import sys

if __package__:  # imported by the trainer (gepo_xtuner.reward.sandbox)
    from . import limits
    from . import syscall_filter as seccomp
    from . import wire
else:  # loaded by the harness as a module beside it (python -I -S)
    import limits
    import syscall_filter as seccomp
    import wire

# Audit events (https://docs.python.org/3/library/audit_events.html) refused by the guard.
_NETWORK_EVENTS = frozenset({'socket.__new__', 'socket.socketpair'})
_PROCESS_EVENTS = frozenset({'os.fork', 'os.forkpty', 'os.posix_spawn', 'os.spawn', 'os.exec',
                             'os.system', 'subprocess.Popen', 'os.kill', 'os.killpg',
                             'signal.pthread_kill'})
# Native escape hatches: ctypes reaches libc directly and _posixsubprocess forks without
# the subprocess.Popen audit event.
_NATIVE_MODULES = frozenset({'ctypes', '_ctypes', '_posixsubprocess'})
# File-system audit events whose arguments the Python-level guard checks: event ->
# (indices of path arguments, indices of dir_fd arguments, whether it modifies).
_FS_EVENTS = {
    'os.listdir': ((0,), (), False), 'os.scandir': ((0,), (), False),
    'os.chdir': ((0,), (), False), 'os.getxattr': ((0,), (), False),
    'os.listxattr': ((0,), (), False), 'os.remove': ((0,), (1,), True),
    'os.rmdir': ((0,), (1,), True), 'os.mkdir': ((0,), (2,), True),
    'os.rename': ((0, 1), (2, 3), True), 'os.link': ((0, 1), (2, 3), True),
    'os.symlink': ((1,), (2,), True), 'os.truncate': ((0,), (), True),
    'os.chmod': ((0,), (2,), True), 'os.chown': ((0,), (3,), True),
    'os.utime': ((0,), (3,), True), 'os.chflags': ((0,), (), True),
    'os.lchflags': ((0,), (), True), 'os.setxattr': ((0,), (), True),
    'os.removexattr': ((0,), (), True), 'shutil.rmtree': ((0,), (1,), True),
}
# What Landlock does not control: changes of metadata (mode, owner, times, xattrs).
_METADATA_EVENTS = frozenset({'os.chmod', 'os.chown', 'os.utime', 'os.chflags', 'os.lchflags',
                              'os.setxattr', 'os.removexattr'})

def _path_checker(fs_guard: dict):
    """``allowed(path, write) -> bool`` for the Python-level file guard."""
    def under(roots):
        return tuple(os.path.join(os.path.realpath(r), '') for r in roots)
    write_roots = under(fs_guard['write'])
    read_roots = write_roots + under(fs_guard['read'])
    read_files = frozenset(os.path.realpath(f) for f in fs_guard.get('read_files', ()))

    def allowed(path, write: bool) -> bool:
        if isinstance(path, int):
            return not write  # a descriptor: reading through it was checked at open
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        real = os.path.realpath(os.fspath(path))  # follows symlinks and '..'
        if not write and real in read_files:
            return True
        return (real + os.sep).startswith(write_roots if write else read_roots)
    return allowed


def install_guard(block_network: bool, block_processes: bool, fs_guard: dict | None) -> None:
    """An audit hook that refuses the given capabilities (cannot be removed later)."""
    events = set()
    if block_network:
        events |= _NETWORK_EVENTS
    metadata_only = fs_guard is not None and fs_guard.get('metadata_only', False)
    if block_processes or (fs_guard is not None and not metadata_only):
        # a child process (a shell running rm) would bypass the file guard
        events |= _PROCESS_EVENTS
    if not events and fs_guard is None:
        return
    modules = _NATIVE_MODULES
    # Process creation outside Python (a shell running curl) would bypass the socket
    # guard, so blocking the network also blocks processes and native calls.
    allowed = _path_checker(fs_guard) if fs_guard is not None else None

    def guard(event: str, args: tuple) -> None:
        if events and event == 'import' and args and args[0] in modules:
            # ImportError, which libraries with optional native parts (numpy) expect
            raise ImportError(f'sandbox: importing {args[0]} is not allowed')
        if event in events or (events and event == 'ctypes.dlopen'):
            raise PermissionError(f'sandbox: {event} is not allowed')
        if allowed is None:
            return
        if metadata_only and event not in _METADATA_EVENTS:
            return
        if event == 'open':
            path, mode, flags = (tuple(args) + (None, None))[:3]
            write = bool((flags or 0) & limits.WRITE_FLAGS) or any(c in (mode or '') for c in 'wax+')
            if path is None or isinstance(path, int):
                return  # an already open descriptor (os.fdopen)
            if not allowed(path, write):
                raise PermissionError(f'sandbox: access to {path!r} is not allowed')
            if os.path.isdir(path):  # its descriptor would resolve dir_fd paths unseen
                raise PermissionError(f'sandbox: opening the directory {path!r} is not allowed')
            return
        rule = _FS_EVENTS.get(event)
        if rule is not None:
            paths, dir_fds, write = rule
            if any(i < len(args) and isinstance(args[i], int) and args[i] >= 0
                   for i in dir_fds):
                raise PermissionError(f'sandbox: {event} relative to a directory descriptor '
                                      'is not allowed')
            for i in paths:
                if i < len(args) and args[i] is not None and not allowed(args[i], write):
                    raise PermissionError(f'sandbox: {event} on {args[i]!r} is not allowed')

    sys.addaudithook(guard)


def serve(namespace: dict, channel: 'wire.Channel') -> None:
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
        return wire._decode(message.get(key), lookup)

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
                channel.send({'value': wire._encode({n: v for n, v in result.items()
                                                if n not in modules}, ref),
                              'modules': modules})
                continue
            obj = lookup(request['ref'])
            if op == 'call':
                args = value(request, 'args')
                kwargs = value(request, 'kwargs')
                result = obj(*args, **kwargs)
                for where, arg in [*enumerate(args), *kwargs.items()]:
                    if type(arg) in wire._MUTABLE:
                        after = wire._encode(arg, ref)
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
            answer = {'value': wire._encode(result, ref)}
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


def solution_process(spec: dict, channel: 'wire.Channel', test_pid: int) -> None:
    """The forked solution process of an assert run: becomes the run's uid, takes the
    seccomp filter that protects ``test_pid``, runs the solution, then serves calls."""
    if spec.get('drop_to') is not None:
        uid, gid = spec['drop_to']
        limits.drop_privileges(uid, gid, spec.get('own', []))
    if spec.get('seccomp'):
        seccomp.apply_filter(protect_pid=test_pid)
    with os.fdopen(spec['code_fd'], encoding='utf-8') as f:
        source = f.read()
    limits.last_steps(spec)
    channel.send({'ready': True})
    try:  # the code runs once the test process has told the trainer it is up
        go = channel.recv()
    except (EOFError, ValueError):
        go = None
    if go != {'go': True}:
        os._exit(1)
    install_guard(spec['block_network'], spec['block_processes'], spec.get('fs_guard'))
    namespace = {'__name__': '__main__', '__builtins__': builtins}
    exec(compile(source, 'solution.py', 'exec'), namespace)  # noqa: S102
    serve(namespace, channel)
