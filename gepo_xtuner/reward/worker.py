"""A persistent helper process that runs a pure verification function under a hard timeout.

Symbolic verifiers (sympy, math-verify, pint) can spend unbounded time inside C code on
adversarial answers: ``\\boxed{9^{9^{9}}}`` makes sympy compute a 370-million-digit
integer, which no signal-based timeout can interrupt. :class:`VerifierWorker` therefore
runs the function in a separate Python process, killed with SIGKILL when a call exceeds
its time limit; the next call starts a fresh process.

The worker imports only the target module and what it imports: the package's
``__init__`` (which loads torch) is bypassed by registering bare package modules, so a
target must depend on the standard library, third-party packages and other such pure
modules of :mod:`gepo_xtuner.reward` only (e.g. :mod:`.answer`).

This file is also the worker's entry point: ``python -I worker.py <module:function>
<memory_mb>``; requests and replies are JSON lines on a private pipe.
"""

import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from typing import Any

__all__ = ['VerifierError', 'VerifierWorker']


class VerifierError(RuntimeError):
    """The verification function raised inside the worker, or the worker died."""


def _terminate(proc: subprocess.Popen, owner_pid: int) -> None:
    if os.getpid() != owner_pid:
        return  # a forked copy at exit: the worker belongs to the parent
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


class VerifierWorker:
    """Calls ``module:function`` in a separate, killable Python process.

    Args:
        target: ``'package.module:function'``; arguments and return value must be JSON
            serialisable.
        timeout_s: wall-clock limit of one call (default 5). On expiry the worker is
            killed and :class:`TimeoutError` raised; the next call restarts it.
        memory_mb: address-space limit (RLIMIT_AS) of the worker, MiB (default 4096;
            ``None``: unlimited). A call that exceeds it fails with ``MemoryError``.
        startup_timeout_s: limit for starting the worker and importing ``target``
            (default 60), kept apart from ``timeout_s`` so a slow import on a loaded
            machine is not mistaken for a slow answer.

    Calls are serialised (one lock); a forked copy of the owner starts its own worker.

    Example:
        >>> square_root = VerifierWorker('math:sqrt', timeout_s=5)
        >>> square_root(16.0)
        4.0
        >>> square_root.close()
    """

    def __init__(self, target: str, timeout_s: float = 5.0, memory_mb: int | None = 4096,
                 startup_timeout_s: float = 60.0) -> None:
        if ':' not in target:
            raise ValueError(f"target must be 'module:function', got {target!r}")
        if not timeout_s > 0:
            raise ValueError(f'timeout_s must be > 0, got {timeout_s}')
        if memory_mb is not None and memory_mb < 64:
            raise ValueError(f'memory_mb must be >= 64 (or None), got {memory_mb}')
        self.target = target
        self.timeout_s = float(timeout_s)
        self.memory_mb = memory_mb
        self.startup_timeout_s = float(startup_timeout_s)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._owner_pid = os.getpid()
        self._finalizer: weakref.finalize | None = None

    # Pickling/deep-copying (e.g. by a config system) copies the settings, not the process.
    def __getstate__(self) -> dict[str, Any]:
        return {'target': self.target, 'timeout_s': self.timeout_s,
                'memory_mb': self.memory_mb, 'startup_timeout_s': self.startup_timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    def __call__(self, *args: Any) -> Any:
        """Runs ``function(*args)`` in the worker and returns its result.

        Raises:
            TimeoutError: the call took longer than ``timeout_s`` (the worker is killed).
            VerifierError: the function raised (message ``'<Type>: <message>'``), or the
                worker died (e.g. killed by the kernel).
        """
        request = (json.dumps({'args': list(args)}) + '\n').encode()
        with self._lock:
            proc = self._ensure_started()
            try:
                proc.stdin.write(request)
                proc.stdin.flush()
            except BrokenPipeError:
                self._kill()
                raise VerifierError(f'verifier worker {self.target} died') from None
            line = self._read_line(proc, time.monotonic() + self.timeout_s)
            if line is None:
                self._kill()
                raise TimeoutError(f'verifier {self.target} took longer than '
                                   f'{self.timeout_s:g} s (worker killed)')
        reply = json.loads(line)
        if 'error' in reply:
            raise VerifierError(reply['error'])
        return reply['value']

    def close(self) -> None:
        """Stops the worker process (a later call starts a new one)."""
        with self._lock:
            self._kill()

    def _ensure_started(self) -> subprocess.Popen:
        if self._proc is not None and self._owner_pid != os.getpid():
            self._proc = None  # forked copy: the pipes belong to the parent's worker
            self._finalizer = None
            self._owner_pid = os.getpid()
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._kill()
        if not sys.executable:
            raise VerifierError('sys.executable is empty: cannot start the verifier worker')
        proc = subprocess.Popen(
            [sys.executable, '-I', os.path.abspath(__file__), self.target,
             str(self.memory_mb or 0)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        self._proc = proc
        self._finalizer = weakref.finalize(self, _terminate, proc, os.getpid())
        line = self._read_line(proc, time.monotonic() + self.startup_timeout_s)
        if line is None or json.loads(line).get('ready') is not True:
            detail = 'timed out' if line is None else json.loads(line).get('error')
            self._kill()
            raise VerifierError(f'verifier worker for {self.target} failed to start: {detail}')
        return proc

    def _read_line(self, proc: subprocess.Popen, deadline: float) -> bytes | None:
        """One reply line, or ``None`` if ``deadline`` passes first."""
        fd = proc.stdout.fileno()
        poller = select.poll()  # not select.select: a trainer's descriptors can exceed 1023
        poller.register(fd, select.POLLIN)
        chunks = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(remaining * 1000):
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                code = proc.wait()
                self._kill()
                raise VerifierError(f'verifier worker {self.target} died (exit code {code}; '
                                    'a negative code is the signal that killed it)')
            chunks.append(chunk)
            if chunk.endswith(b'\n'):
                return b''.join(chunks)

    def _kill(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # kills and reaps once, then detaches
        self._proc = None
        self._finalizer = None


def _serve(target: str, memory_mb: int) -> None:
    """Worker main loop: one JSON request per stdin line, one JSON reply per line."""
    import importlib
    import logging
    import resource
    import types

    # Replies go to a private copy of stdout; anything the libraries print goes to stderr.
    reply_stream = os.fdopen(os.dup(1), 'w', encoding='utf-8')
    os.dup2(2, 1)
    if memory_mb > 0:
        limit = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    logging.disable(logging.WARNING)  # e.g. math-verify's notices about its own timeouts
    # Bare package modules, so importing gepo_xtuner.reward.<pure module> skips the
    # package __init__ files (they import torch).
    reward_dir = os.path.dirname(os.path.abspath(__file__))
    for name, path in (('gepo_xtuner', os.path.dirname(reward_dir)),
                       ('gepo_xtuner.reward', reward_dir)):
        package = types.ModuleType(name)
        package.__path__ = [path]
        sys.modules[name] = package

    def reply(message: dict[str, Any]) -> None:
        reply_stream.write(json.dumps(message) + '\n')
        reply_stream.flush()

    module_name, func_name = target.split(':', 1)
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except Exception as exc:  # noqa: BLE001  (the parent raises with this message)
        reply({'error': f'{type(exc).__name__}: {exc}'})
        return
    reply({'ready': True})
    for line in sys.stdin:
        try:
            reply({'value': func(*json.loads(line)['args'])})
        except Exception as exc:  # noqa: BLE001  (the parent raises with this message)
            reply({'error': f'{type(exc).__name__}: {exc}'})


if __name__ == '__main__':
    _serve(sys.argv[1], int(sys.argv[2]))
