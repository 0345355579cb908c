"""Child side of :mod:`gepo_xtuner.reward.sandbox`: limits itself, then runs the solution.

Run by the sandbox as ``python -I -S sandbox_harness.py '<json spec>'`` in the run's
working directory, with stdin/stdout/stderr already redirected to files. Standard
library only (``-S``: no ``site``, so no ``.pth`` start-up hooks; the interpreter's
site-packages directories are appended to ``sys.path`` by hand).

Order matters: every limit and guard is in place before the first line of untrusted
code runs, and limits are set with hard == soft so the code cannot raise them again.

Spec keys: ``code_fd`` (a readable descriptor holding the source), ``tests_fd`` (the
assert tests and their nonce as JSON, read only by the test process of an assert run) and
``control_fd`` (a writable one: ``ready`` then, in call mode, one typed JSON value per
call; in asserts mode ``asserts-ok <nonce> <calls>`` or ``unsupported <nonce> <reason>``),
``mode`` (``'stdin'``, ``'call'`` or ``'asserts'``: :func:`run_assert_tests`, two
processes), ``fn_name`` and ``args`` or ``calls`` (call mode), ``cpu_s``,
``memory_bytes``, ``preload`` (modules a HumanEval prompt imports, imported before the
fork), ``cgroup_fds`` (``cgroup.procs`` files to join), ``drop_to`` (``[uid,
gid]`` the code becomes for good, root only), ``drop_tests_to`` (the test process's, root
only) and ``own`` (paths to give the code's uid first), ``seccomp`` (install
:mod:`sandbox_seccomp`'s filter), ``max_output_bytes``, ``max_processes``,
``block_network``, ``block_processes``, ``site_dirs``, ``landlock`` (None or the rules of
:func:`apply_landlock`) and ``fs_guard`` (None or ``{'read': [...], 'write': [...],
'read_files': [...], 'metadata_only': bool}``: the Python-level file guard; at the weaker
levels it checks every file access and refuses process creation, with Landlock only the
metadata changes Landlock does not control).
"""

import builtins
import json
import os
import resource
import signal
import sys

if __package__:  # imported by the trainer (gepo_xtuner.reward.sandbox)
    from . import sandbox_remote as remote
    from . import sandbox_seccomp as seccomp
else:
    # run as the sandbox's script (-I: no package, no script directory on sys.path): the
    # two modules beside this file are imported before any restriction, and the directory
    # is taken off sys.path again so that the code cannot import the package's other
    # modules by name
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import sandbox_remote as remote
        import sandbox_seccomp as seccomp
    finally:
        del sys.path[0]

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
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

# Landlock (Linux >= 5.13): syscall numbers are shared by every architecture.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_PR_SET_NO_NEW_PRIVS = 38
_RULE_PATH_BENEATH = 1
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 14, 1 << 15
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


def _fs_access_mask(abi: int) -> int:
    """Every file-system right Landlock ABI ``abi`` knows (13 in v1, +REFER, +TRUNCATE, +IOCTL_DEV)."""
    bits = 13 + (abi >= 2) + (abi >= 3) + (abi >= 5)
    return (1 << bits) - 1


def _landlock_syscalls():
    import ctypes  # noqa: PLC0415  (only here: see apply_landlock)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return ctypes, libc


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 if Landlock is unavailable (old kernel,
    not enabled at boot, or the syscall filtered by a container's seccomp profile)."""
    try:
        ctypes, libc = _landlock_syscalls()
    except (ImportError, OSError):
        return 0
    version = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(0, int(version))


def apply_landlock(read: list[str], write: list[str], read_files: list[str],
                   rw_files: list[str], block_tcp: bool) -> int:
    """Restricts this process (and everything it starts) with Landlock.

    Afterwards it can read and execute only under ``read`` and ``read_files``, read and
    write only under ``write`` and ``rw_files``; everything else of the file system is
    refused by the kernel (listing, reading, writing, creating, deleting, renaming,
    linking). With ABI >= 4 and ``block_tcp``, TCP bind and connect are refused; with
    ABI >= 6 signals to and abstract UNIX sockets of processes outside the sandbox are.
    Paths that do not exist are skipped.

    Returns:
        The ABI version used.

    Raises:
        OSError: Landlock is unavailable or a call failed.
    """
    ctypes, libc = _landlock_syscalls()
    abi = int(libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))
    if abi < 1:
        raise OSError(ctypes.get_errno(), 'Landlock is unavailable')

    class RulesetAttr(ctypes.Structure):
        _fields_ = [('handled_access_fs', ctypes.c_uint64), ('handled_access_net', ctypes.c_uint64),
                    ('scoped', ctypes.c_uint64)]

    class PathBeneathAttr(ctypes.Structure):
        _pack_ = 1
        _fields_ = [('allowed_access', ctypes.c_uint64), ('parent_fd', ctypes.c_int32)]

    handled = _fs_access_mask(abi)
    attr = RulesetAttr(handled, 3 if (abi >= 4 and block_tcp) else 0,
                       (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)  # the struct grew with the ABI
    ruleset = int(libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                               ctypes.c_uint32(0)))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), 'landlock_create_ruleset failed')
    file_rights = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
    read_rights = (_FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR) & handled
    rules = ([(p, read_rights) for p in read] + [(p, handled) for p in write]
             + [(p, (_FS_EXECUTE | _FS_READ_FILE) & handled) for p in read_files]
             + [(p, (_FS_READ_FILE | _FS_WRITE_FILE | _FS_IOCTL_DEV) & handled & file_rights)
                for p in rw_files])
    try:
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not os.path.isdir(path):
                    rights &= file_rights  # only file rights apply to a file
                rule = PathBeneathAttr(rights, fd)
                if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), f'landlock_add_rule failed for {path}')
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), 'prctl(PR_SET_NO_NEW_PRIVS) failed')
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), 'landlock_restrict_self failed')
    finally:
        os.close(ruleset)
    return abi


def _set_limit(kind: int, soft: int, hard: int | None = None) -> None:
    resource.setrlimit(kind, (soft, soft if hard is None else hard))


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


def _install_guard(block_network: bool, block_processes: bool, fs_guard: dict | None) -> None:
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
            write = bool((flags or 0) & _WRITE_FLAGS) or any(c in (mode or '') for c in 'wax+')
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


# ------------------------------------------------------------ values leaving the sandbox

#: Types whose values leave the sandbox (exactly these: no subclasses, whose ``__eq__``
#: or ``__hash__`` the code could have written).
_PLAIN_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_MAX_ITEMS = remote._MAX_ITEMS  # the bounds the trainer decodes with


def encode_value(value: object) -> object:
    """A JSON-ready, typed copy of a return value made only of builtin types.

    ``int``/``float``/``bool``/``str``/``None`` stay JSON values (JSON keeps ints and
    floats apart); lists stay lists; tuples, sets, frozensets, dicts (as key/value
    pairs, so non-string keys survive), bytes and complex numbers are tagged objects
    ``{"__tuple__": [...]}`` etc. Anything else (a class of the code's own, a subclass of
    a builtin) raises ``TypeError``: such an object could compare equal to anything.
    """
    budget = [_MAX_ITEMS]

    def enc(v: object, depth: int) -> object:
        budget[0] -= 1
        if budget[0] < 0 or depth > remote._MAX_DEPTH:
            raise ValueError('the return value is too large or too deeply nested')
        t = type(v)
        if t in (type(None), bool, int, float, str):
            return v
        if t is bytes:
            return {'__bytes__': v.hex()}
        if t is complex:
            return {'__complex__': [v.real, v.imag]}
        if t is list:
            return [enc(x, depth + 1) for x in v]
        if t is tuple:
            return {'__tuple__': [enc(x, depth + 1) for x in v]}
        if t in (set, frozenset):
            return {f'__{t.__name__}__': [enc(x, depth + 1) for x in v]}
        if t is dict:
            return {'__dict__': [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]}
        raise TypeError(f'a value of type {t.__module__}.{t.__qualname__} cannot be compared '
                        'safely (only builtin types: numbers, str, bytes, None, list, tuple, '
                        'set, frozenset, dict)')
    return enc(value, 0)


def _exit(code: object = None) -> None:
    """``exit()`` / ``quit()`` (``site`` defines them; the harness runs without it)."""
    raise SystemExit(code)


def join_cgroups(fds: list[int]) -> None:
    """Moves this process into the cgroups whose ``cgroup.procs`` files ``fds`` are.

    The parent opened the files (as root, outside the sandbox, where ``/sys/fs/cgroup``
    is not mounted); the kernel checks the opener's credentials, so writing ``0`` (this
    process) works here too. Everything the code starts is then counted and limited
    there (``pids.max``, the memory limit). The descriptors are closed afterwards.
    """
    for fd in fds:
        try:
            os.write(fd, b'0')
        finally:
            os.close(fd)


def _no_new_privs() -> None:
    ctypes, libc = _landlock_syscalls()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), 'prctl(PR_SET_NO_NEW_PRIVS) failed')


def drop_privileges(uid: int, gid: int, own: list[str]) -> None:
    """Becomes the unprivileged ``uid``/``gid`` for good (root only).

    ``own`` (the working directory) is given to that user first. Afterwards the process
    has no capabilities, no supplementary groups, real = effective = saved ids, and
    cannot gain privileges again (no_new_privs: setuid programs do not elevate).
    Checked: a ``setuid(0)`` must fail, else this raises.
    """
    for path in own:
        os.chown(path, uid, gid)
    _no_new_privs()
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise OSError('the sandbox could not drop its privileges')
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise OSError('the sandbox regained root after dropping it')


_PR_SET_DUMPABLE = 4


def _set_dumpable(on: bool) -> None:
    """Non-dumpable: processes of the same user can neither trace this one nor read its
    memory, descriptors or environment under /proc (the kernel's ptrace access check)."""
    ctypes, libc = _landlock_syscalls()
    if libc.prctl(_PR_SET_DUMPABLE, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), 'prctl(PR_SET_DUMPABLE) failed')


def _forget_ctypes() -> None:
    """ctypes was needed for the syscalls; forget it so that a later ``import ctypes`` by
    the code is a real import (and meets the guard's import check where one is)."""
    for name in ('ctypes', 'ctypes._endian', '_ctypes'):
        sys.modules.pop(name, None)


def _last_steps(spec: dict) -> None:
    """What every process that runs the code does last: the address-space limit, the
    interpreter's site directories, ``exit``/``quit``."""
    _forget_ctypes()
    _set_limit(resource.RLIMIT_AS, spec['memory_bytes'])
    sys.path.extend(spec.get('site_dirs', []))
    builtins.exit = builtins.quit = _exit


def _solution_process(spec: dict, channel: 'remote.Channel', test_pid: int) -> None:
    """The forked solution process of an assert run: becomes the run's uid, takes the
    seccomp filter that protects ``test_pid``, runs the solution, then serves calls."""
    if spec.get('drop_to') is not None:
        uid, gid = spec['drop_to']
        drop_privileges(uid, gid, spec.get('own', []))
    if spec.get('seccomp'):
        seccomp.apply_filter(protect_pid=test_pid)
    with os.fdopen(spec['code_fd'], encoding='utf-8') as f:
        source = f.read()
    _last_steps(spec)
    channel.send({'ready': True})
    _install_guard(spec['block_network'], spec['block_processes'], spec.get('fs_guard'))
    namespace = {'__name__': '__main__', '__builtins__': builtins}
    exec(compile(source, 'solution.py', 'exec'), namespace)  # noqa: S102
    remote.serve(namespace, channel)


#: The test process's home and temporary directory: a path that does not exist under a
#: root no run can write to, so that nothing a library looks for there (caches, config,
#: ``.pth`` files of a user site) can be the solution's.
JUDGE_HOME = '/nonexistent'
#: Variables the test process keeps from the run's environment (the trainer passes only
#: these and ``HOME`` / ``TMPDIR``, which point at the solution's folder).
_JUDGE_ENV_KEEP = ('PATH', 'LANG', 'LC_ALL', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS',
                   'MKL_NUM_THREADS')


_JUDGE_LANDLOCK = [False]  # whether the test process runs under its Landlock rules


def _judge_environment(landlock: dict | None) -> None:
    """Gives the test process an environment of its own, before it reads anything.

    ``HOME`` and ``TMPDIR`` become :data:`JUDGE_HOME`, every other variable but
    :data:`_JUDGE_ENV_KEEP` goes, the working directory is ``/``; with Landlock
    (``landlock``: :func:`apply_landlock`'s rules, the system's and the interpreter's
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
        apply_landlock(**landlock)
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
            write = bool((flags or 0) & _WRITE_FLAGS) or any(c in (mode or '') for c in 'wax+')
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


def run_assert_tests(spec: dict, control) -> None:
    """Asserts mode: the solution and the tests in two processes (:mod:`sandbox_remote`).

    Forks before the tests are read, so the solution process never holds them; the
    parent becomes the test process, under a uid of its own where the trainer is root
    (``drop_tests_to``), non-dumpable in any case, and alone writes the verdict
    ``asserts-ok <nonce> <calls>`` (or ``unsupported <nonce> <reason as JSON>``).
    """
    for name in spec.get('preload', []):  # standard library only: site dirs come later
        try:
            __import__(name)
        except ImportError:
            pass
    _set_dumpable(False)  # before the fork: no moment in which the solution could attach
    test_pid = os.getpid()
    to_solution_r, to_solution_w = os.pipe()
    to_tests_r, to_tests_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            for fd in (control.fileno(), spec['tests_fd'], to_solution_w, to_tests_r):
                os.close(fd)
            _solution_process(spec, remote.Channel(to_solution_r, to_tests_w), test_pid)
            status = 0
        except SystemExit as exc:  # the solution's exit(): the verdict is the tests' anyway
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001  (reported on stderr, the run fails)
            import traceback  # noqa: PLC0415
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except BaseException:  # noqa: BLE001  (the code may have closed or replaced it)
                    pass
            os._exit(status)  # never the trainer's atexit handlers or the code's threads
    for fd in (to_solution_r, to_tests_w, spec['code_fd']):
        os.close(fd)
    trace = _trace_reads() if spec.get('trace_judge') else None
    if spec.get('drop_tests_to') is not None:
        uid, gid = spec['drop_tests_to']
        drop_privileges(uid, gid, [])
        _set_dumpable(False)  # a change of credentials may reset it
    _judge_environment(spec.get('judge_landlock'))
    if spec.get('seccomp'):
        seccomp.apply_filter()
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # no KeyboardInterrupt inside a test's try
    with os.fdopen(spec['tests_fd'], encoding='utf-8') as f:
        tests = json.load(f)
    channel = remote.Channel(to_tests_r, to_solution_w)
    try:
        hello = channel.recv()
    except (EOFError, ValueError):
        hello = None
    if hello != {'ready': True}:
        raise RuntimeError('the solution process failed before running the code')
    control.write('ready\n')
    control.flush()
    _last_steps(spec)
    client = remote.SolutionClient(channel, frozenset(tests['modules']))
    nonce = tests['nonce']
    try:
        calls = remote.run_tests(client, tests['program'], tests['prelude'],
                                 tests['entry_point'], tests['names'])
    except remote.UnsupportedTest as exc:
        control.write(f'unsupported {nonce} {json.dumps(str(exc))}\n')
        control.flush()
        os._exit(3)
    finally:
        if trace is not None:  # before the verdict, and on a failure too
            control.write(f'judge-trace {json.dumps(_trace_report(trace))}\n')
            control.flush()
    if calls == 0:
        raise AssertionError('the tests never called the solution')
    control.write(f'asserts-ok {nonce} {calls}\n')
    control.flush()
    _let_solution_finish(pid, channel, to_solution_w)


def _let_solution_finish(pid: int, channel: 'remote.Channel', write_fd: int,
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


def main() -> None:
    spec = json.loads(sys.argv[1])
    _set_limit(resource.RLIMIT_CORE, 0)
    _set_limit(resource.RLIMIT_FSIZE, spec['max_output_bytes'])
    _set_limit(resource.RLIMIT_NOFILE, 256)
    if spec['max_processes']:
        # counted per user: the kernel enforces it for any uid but root, which is why a
        # root trainer's sandbox runs under a uid of its own (``drop_to``)
        _set_limit(resource.RLIMIT_NPROC, spec['max_processes'])
    # SIGXCPU at the soft limit, SIGKILL one second later (a PID-namespace init
    # ignores SIGXCPU but not the kernel's SIGKILL).
    _set_limit(resource.RLIMIT_CPU, spec['cpu_s'], spec['cpu_s'] + 1)
    join_cgroups(spec.get('cgroup_fds', []))
    control = os.fdopen(spec['control_fd'], 'w', encoding='utf-8')
    if spec.get('landlock') is not None:
        apply_landlock(**spec['landlock'])
    if spec['mode'] == 'asserts':
        run_assert_tests(spec, control)
        return
    with os.fdopen(spec['code_fd'], encoding='utf-8') as f:
        source = f.read()
    if spec.get('drop_to') is not None:
        uid, gid = spec['drop_to']
        drop_privileges(uid, gid, spec.get('own', []))
    if spec.get('seccomp'):
        seccomp.apply_filter()
    _last_steps(spec)
    control.write('ready\n')  # tells the parent that failures from here on are the solution's
    control.flush()
    _install_guard(spec['block_network'], spec['block_processes'], spec.get('fs_guard'))
    code = compile(source, 'solution.py', 'exec')  # a SyntaxError fails the run
    if spec['mode'] == 'stdin':
        sys.argv = ['solution.py']
        exec(code, {'__name__': '__main__', '__builtins__': builtins})  # noqa: S102
        return
    namespace = {'__name__': 'solution', '__builtins__': builtins}
    exec(code, namespace)  # noqa: S102  (running it is the point)
    for fn_name, args in spec.get('calls') or [(spec['fn_name'], spec['args'])]:
        fn = namespace.get(fn_name)
        if fn is None and isinstance(namespace.get('Solution'), type):
            fn = getattr(namespace['Solution'](), fn_name, None)  # LeetCode style
        if fn is None:
            raise NameError(f'the solution defines neither {fn_name}() nor '
                            f'Solution.{fn_name}()')
        value = encode_value(fn(*args))  # TypeError for a value of the code's own class
        control.write(json.dumps({'value': value}) + '\n')
        control.flush()


if __name__ == '__main__':
    main()
