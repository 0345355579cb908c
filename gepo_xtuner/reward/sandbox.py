"""Runs untrusted Python code in a separate, limited process (the code reward's sandbox).

What a run gets (see docs/rewards.md for the full statement of guarantees):

* a **separate process** (``python -I``: no user site-packages, ``PYTHON*`` variables
  ignored) in its **own session**, started with a minimal environment (the trainer's
  variables, e.g. API tokens, are not passed), in a **fresh temporary working
  directory** that is deleted afterwards;
* **limits** set before the code runs, hard == soft: CPU time (RLIMIT_CPU), address
  space (RLIMIT_AS), size of any written file incl. stdout/stderr (RLIMIT_FSIZE), open
  files (RLIMIT_NOFILE), no core dumps; a **wall-clock limit** after which the whole
  process group is killed; every run ends with SIGKILL to the process group;
* with ``isolation='namespaces'`` (``unshare -r -n -p -f --kill-child``, needs
  unprivileged user namespaces): **no network** (an empty network namespace, the
  kernel's guarantee) and a **PID namespace**, so killing its first process kills
  every process the code started, even ones that left the session;
* with ``isolation='audit_hook'`` (no namespaces available): a Python audit hook,
  installed before the code runs, refuses socket creation, process creation and
  signals (fork/exec/spawn/subprocess/system/kill) and ctypes. This is best effort
  at the Python level, not a security boundary: native code from an importable C
  extension is not covered;
* **process count**: RLIMIT_NPROC (``max_processes``) where the kernel enforces it,
  i.e. when the trainer does not run as root. Root ignores RLIMIT_NPROC, so as root
  process creation is refused by the audit hook in both modes.

Not isolated: the file system. The code runs with the trainer's user id and can read
(and write) whatever that user can, including the dataset. Run training as an
unprivileged user or in a container if that matters.
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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mmengine.logging import print_log

__all__ = ['Sandbox', 'SandboxError', 'SandboxResult']

_HARNESS = str(Path(__file__).with_name('sandbox_harness.py'))
_UNSHARE_ARGS = ('--map-root-user', '--net', '--pid', '--fork', '--kill-child')


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start the process or set its limits)."""


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one run.

    Attributes:
        status: ``'ok'`` (exit code 0), ``'error'`` (non-zero exit or signal),
            ``'timeout'`` (killed at the wall-clock or CPU-time limit) or ``'output_limit'``
            (stdout reached ``max_output_bytes``).
        returncode: the process's exit code (negative: killed by that signal).
        stdout: what the code printed (UTF-8, undecodable bytes replaced).
        stderr: the last 4 KiB of its standard error.
        value: call mode: the function's return value after a JSON round trip.
        has_value: call mode: whether the function returned (``value`` may be None).
        wall_s: wall-clock seconds of the run.
    """

    status: Literal['ok', 'error', 'timeout', 'output_limit']
    returncode: int | None
    stdout: str
    stderr: str
    value: Any = None
    has_value: bool = False
    wall_s: float = 0.0


@functools.cache
def namespaces_available(python: str) -> bool:
    """Whether ``unshare`` can create user, network and PID namespaces here."""
    unshare = shutil.which('unshare')
    if unshare is None:
        return False
    try:
        done = subprocess.run([unshare, *_UNSHARE_ARGS, '--', python, '-I', '-c', 'pass'],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


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


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Waits for ``proc`` to exit WITHOUT reaping it; False on timeout.

    Not reaping keeps its process-group id reserved, so the final ``killpg`` cannot hit
    an unrelated group that reused the number.
    """
    deadline = time.monotonic() + timeout_s
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
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if poller is not None:
                poller.poll(remaining * 1000)
            else:
                time.sleep(min(delay, remaining))
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
        isolation: ``'auto'`` (default: namespaces if available, else the audit hook,
            with a warning), ``'namespaces'`` (raise if unavailable) or ``'audit_hook'``.
        python: interpreter for the code (default: this one, ``sys.executable``).
        tmp_dir: parent of the per-run working directories (default: the system's).

    Raises:
        SandboxError: ``isolation='namespaces'`` but namespaces are unavailable.

    Example:
        >>> result = Sandbox(timeout_s=5).run('print(int(input()) * 2)', stdin='21\\n')
        >>> result.status, result.stdout
        ('ok', '42\\n')
    """

    def __init__(self, timeout_s: float = 5.0, memory_mb: int = 1024,
                 max_output_bytes: int = 8 << 20, max_processes: int = 32,
                 isolation: Literal['auto', 'namespaces', 'audit_hook'] = 'auto',
                 python: str | None = None, tmp_dir: str | None = None) -> None:
        if not timeout_s > 0:
            raise ValueError(f'timeout_s must be > 0, got {timeout_s}')
        if memory_mb < 64:
            raise ValueError(f'memory_mb must be >= 64 (the interpreter needs it), got {memory_mb}')
        if max_output_bytes < 1 or max_processes < 1:
            raise ValueError('max_output_bytes and max_processes must be >= 1')
        if isolation not in ('auto', 'namespaces', 'audit_hook'):
            raise ValueError(f"isolation must be 'auto', 'namespaces' or 'audit_hook', "
                             f'got {isolation!r}')
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_output_bytes = int(max_output_bytes)
        self.max_processes = int(max_processes)
        self.python = python or sys.executable
        self.tmp_dir = tmp_dir
        if isolation != 'audit_hook' and namespaces_available(self.python):
            self.isolation = 'namespaces'
        elif isolation == 'namespaces':
            raise SandboxError("isolation='namespaces' but `unshare -r -n -p -f` does not "
                               'work here (util-linux missing or unprivileged user namespaces '
                               "disabled); use isolation='audit_hook'")
        else:
            if isolation == 'auto':
                print_log('code sandbox: user/network/PID namespaces are unavailable; network '
                          'and process creation are refused by a Python audit hook instead '
                          '(best effort, see docs/rewards.md)', logger='current', level=30)
            self.isolation = 'audit_hook'

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

    def _command(self, spec: dict[str, Any]) -> list[str]:
        cmd = [self.python, '-I', _HARNESS, json.dumps(spec)]
        if self.isolation == 'namespaces':
            cmd = [shutil.which('unshare') or 'unshare', *_UNSHARE_ARGS, '--', *cmd]
        return cmd

    def _run_in(self, root: str, code: str, stdin: str, fn_name: str | None,
                args: list | None) -> SandboxResult:
        work = os.path.join(root, 'work')
        os.mkdir(work)
        paths = {name: os.path.join(root, name) for name in
                 ('solution.py', 'stdin.txt', 'stdout.txt', 'stderr.txt', 'result.json', 'ready')}
        # errors='replace': a lone surrogate from a bad decode is the solution's problem
        Path(paths['solution.py']).write_text(code, encoding='utf-8', errors='replace')
        Path(paths['stdin.txt']).write_text(stdin, encoding='utf-8', errors='replace')
        spec = {'code_path': paths['solution.py'], 'ready_path': paths['ready'],
                'result_path': paths['result.json'],
                'mode': 'stdin' if fn_name is None else 'call', 'fn_name': fn_name,
                'args': list(args or []), 'cpu_s': max(1, math.ceil(self.timeout_s)),
                'memory_bytes': self.memory_mb << 20, 'max_output_bytes': self.max_output_bytes,
                'max_processes': self.max_processes,
                'block_network': self.isolation == 'audit_hook',
                # the kernel ignores RLIMIT_NPROC for root: refuse process creation instead
                'block_processes': self.isolation == 'audit_hook' or os.geteuid() == 0}
        env = {'PATH': os.defpath, 'LANG': 'C.UTF-8', 'LC_ALL': 'C.UTF-8', 'HOME': work,
               'TMPDIR': work, 'OMP_NUM_THREADS': '1', 'OPENBLAS_NUM_THREADS': '1',
               'MKL_NUM_THREADS': '1'}
        start = time.monotonic()
        with open(paths['stdin.txt'], 'rb') as fin, open(paths['stdout.txt'], 'wb') as fout, \
                open(paths['stderr.txt'], 'wb') as ferr:
            try:
                proc = subprocess.Popen(self._command(spec), stdin=fin, stdout=fout, stderr=ferr,
                                        cwd=work, env=env, start_new_session=True,
                                        close_fds=True)
            except OSError as exc:
                raise SandboxError(f'cannot start the sandbox process: {exc}') from exc
        try:
            finished = _wait(proc, self.timeout_s)
        finally:
            try:  # everything the code started, whether it finished or not
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            returncode = proc.wait()
        wall_s = time.monotonic() - start
        stdout, stdout_size = self._read(paths['stdout.txt'], head=True)
        stderr, _ = self._read(paths['stderr.txt'], head=False)
        if not os.path.exists(paths['ready']):
            if not finished:
                raise SandboxError(f'the sandbox did not start within {self.timeout_s:g} s '
                                   '(machine overloaded?)')
            raise SandboxError(f'the sandbox failed before running the code (exit code '
                               f'{returncode}): {stderr.strip()[-1000:]}')
        value, has_value = None, False
        if fn_name is not None and finished and returncode == 0:
            try:
                value = json.loads(Path(paths['result.json']).read_text(encoding='utf-8'))['value']
                has_value = True
            except (OSError, ValueError, KeyError, TypeError):
                pass
        # SIGXCPU: the CPU-time limit (as long as the wall limit) struck first; on an
        # idle machine the wall clock usually wins by the start-up time, but not always
        if not finished or returncode == -signal.SIGXCPU:
            status = 'timeout'
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
