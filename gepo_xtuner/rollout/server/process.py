"""An inference server as a subprocess the trainer owns: start, health wait, stop, log.

:class:`ServerProcess` is the engine-independent part; an engine's subclass names the
engine (:attr:`ServerProcess.ENGINE`), fills the command template
(:attr:`ServerProcess.COMMAND`, :meth:`ServerProcess.fields`,
:meth:`ServerProcess.flags`) and adds its own launch settings.
"""

import atexit
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import httpx

#: the launch settings every engine's server process takes
LAUNCH_KEYS: frozenset[str] = frozenset(
    {'model_path', 'host', 'port', 'python', 'extra_args', 'env', 'log_file',
     'startup_timeout_s', 'command', 'trust_remote_code'})

#: how many lines of the log a startup failure quotes
LOG_LINES = 40
#: a log line that names an error (where the log holds no Python traceback)
_ERROR_LINE = re.compile(r'\b\w*(Error|Exception)\b|\bFATAL\b|\berror:', re.IGNORECASE)


def runs_remote_code(model: Any) -> bool:
    """Whether ``model`` is an instance of a checkpoint's own code (``from_pretrained`` with
    ``trust_remote_code=True`` on a model that ships it: transformers imports that code
    as ``transformers_modules.*``), so a server loading the same checkpoint needs
    ``--trust-remote-code`` too."""
    return type(model).__module__.startswith('transformers_modules')


def free_port(host: str = '127.0.0.1') -> int:
    """A TCP port nobody listens on right now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now (connections closing are fine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


class ServerProcess:
    """One API server in its own process group, its output in a log file.

    The default command is :attr:`COMMAND`, each item formatted with :meth:`fields`,
    followed by :meth:`flags`, ``--trust-remote-code`` (where asked) and ``extra_args``.
    ``command`` replaces the whole argv; its items may contain ``{model_path}``,
    ``{host}`` and ``{port}``, filled in at each start (a restart on new weights changes
    ``{model_path}``).

    ``python`` may be another environment's interpreter: inference engines pin torch and
    transformers versions that differ from the trainer's, so they often live apart.

    Args:
        model_path: model directory or hub id the server loads.
        host: address the server binds and clients connect to (default ``127.0.0.1``).
        port: TCP port; ``0`` picks a free one (default: :attr:`DEFAULT_PORT`).
        python: interpreter with the engine installed.
        extra_args: appended to the default command.
        env: extra environment variables for the server.
        log_file: where stdout and stderr go (default: a new temporary file).
        startup_timeout_s: how long :meth:`start` waits for ``GET /health`` to answer 200.
        command: full argv template replacing the default one.
        trust_remote_code: start the server with ``--trust-remote-code``: checkpoints that
            ship their own code need it for their config, tokenizer and processor.
            ``None`` (default): as the trainer's policy, decided when the backend is
            attached (:func:`runs_remote_code`); the server loads the same checkpoint.

    Raises:
        ValueError: no ``model_path``, or a ``command`` that is not a list of strings.
        TypeError: ``extra_args`` given as one string.
    """

    #: the engine's name in messages (and the log file's prefix)
    ENGINE: ClassVar[str] = 'inference'
    #: the default command; items are formatted with :meth:`fields`
    COMMAND: ClassVar[tuple[str, ...]] = ()
    #: the port when none is given
    DEFAULT_PORT: ClassVar[int] = 8000
    #: an example ``model_path`` for the message when it is missing
    EXAMPLE_MODEL: ClassVar[str] = 'Qwen/Qwen2.5-7B-Instruct'

    def __init__(self, model_path: str | None = None, host: str = '127.0.0.1',
                 port: int | None = None, python: str = 'python',
                 extra_args: list[str] | tuple[str, ...] = (), env: dict[str, Any] | None = None,
                 log_file: str | None = None, startup_timeout_s: float = 900.0,
                 command: list[str] | None = None,
                 trust_remote_code: bool | None = None) -> None:
        if model_path is None:
            raise ValueError(f'launch needs model_path (the model the {self.ENGINE} server '
                             f"loads), e.g. launch=dict(model_path='{self.EXAMPLE_MODEL}')")
        if command is not None and (isinstance(command, str) or not command):
            raise ValueError(f'launch.command must be a non-empty list of argv strings, got '
                             f'{command!r}')
        if isinstance(extra_args, str):
            raise TypeError(f'launch.extra_args must be a list of strings, got {extra_args!r}')
        self.model_path = str(model_path)
        self.host = host
        # 0: resolved at the first start (no sockets at config time)
        self.port = int(self.DEFAULT_PORT if port is None else port)
        self.python = python
        self.extra_args = [str(a) for a in extra_args]
        self.env = {k: str(v) for k, v in (env or {}).items()}
        self.startup_timeout_s = float(startup_timeout_s)
        self.command = None if command is None else [str(a) for a in command]
        self.log_file = None if log_file is None else Path(log_file)
        self.trust_remote_code = None if trust_remote_code is None else bool(trust_remote_code)
        self.proc: subprocess.Popen | None = None
        self._argv: list[str] = []
        self._atexit_registered = False

    @property
    def url(self) -> str:
        return f'http://{self.host}:{self.port}'

    # ------------------------------------------------------------ the command
    def fields(self, model_path: str) -> dict[str, Any]:
        """The values :attr:`COMMAND`'s items are formatted with (subclasses add theirs)."""
        return {'python': self.python, 'model_path': model_path, 'host': self.host,
                'port': self.port}

    def flags(self) -> list[str]:
        """Arguments after :attr:`COMMAND` that depend on settings (none by default)."""
        return []

    def argv(self, model_path: str | None = None) -> list[str]:
        """The command that starts the server on ``model_path`` (default: the configured one)."""
        model_path = str(model_path or self.model_path)
        if self.command is not None:
            fields = {'model_path': model_path, 'host': self.host, 'port': self.port}
            return [a.format(**fields) for a in self.command]
        fields = self.fields(model_path)
        return [a.format(**fields) for a in self.COMMAND] + self.flags() + (
            ['--trust-remote-code'] if self.trust_remote_code else []) + self.extra_args

    # ------------------------------------------------------------- lifecycle
    def start(self, model_path: str | None = None) -> None:
        """Starts the server and returns once ``GET /health`` answers 200.

        Raises:
            RuntimeError: the port is taken, or the process exited during startup (with
                the log's first error and its tail).
            TimeoutError: not healthy within ``startup_timeout_s`` (the process is stopped).
        """
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f'the {self.ENGINE} server at {self.url} is already running')
        if self.port == 0:
            self.port = free_port(self.host)
        elif not port_is_free(self.host, self.port):
            # Else a server left over from an earlier run would answer our health checks.
            raise RuntimeError(f'port {self.port} on {self.host} is already in use (a '
                               f'{self.ENGINE} server left from an earlier run?); stop that '
                               'process or set another launch.port')
        if self.log_file is None:
            fd, name = tempfile.mkstemp(prefix=f'{self.ENGINE.lower()}_server_', suffix='.log')
            os.close(fd)
            self.log_file = Path(name)
        argv = self._argv = self.argv(model_path)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, 'ab') as log:
            log.write(f'\n$ {" ".join(argv)}\n'.encode())
            log.flush()
            # A new session: stop() can signal the server and every worker it forks.
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, **self.env})
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx.Client(timeout=5.0) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    self.stop()  # workers it forked may still run
                    raise RuntimeError(
                        f'the {self.ENGINE} server ({" ".join(self._argv)}) exited with code '
                        f'{code} during startup{self._cause()}; log {self.log_file}:\n'
                        f'{self.log_tail()}')
                try:
                    if client.get(f'{self.url}/health').status_code == 200:
                        return
                except httpx.HTTPError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(
                        f'the {self.ENGINE} server at {self.url} was not healthy after '
                        f'{self.startup_timeout_s:.0f} s (launch.startup_timeout_s)'
                        f'{self._cause()}; log {self.log_file}:\n{self.log_tail()}')
                time.sleep(0.2)

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``grace_s`` (idempotent)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        else:
            proc.wait()
        # Workers the server forked into its group may outlive it; end them too.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        """Stops the server and forgets the exit hook."""
        self.stop()
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False

    def log_tail(self, lines: int = LOG_LINES) -> str:
        """The last ``lines`` lines of the server log."""
        try:
            text = self.log_file.read_text(errors='replace')
        except (OSError, AttributeError):
            return '(no log)'
        return '\n'.join(text.splitlines()[-lines:])

    def first_error(self) -> str | None:
        """The first error of the latest start in the log, or None.

        The cause of a failed start is often far above the log's tail (a server prints
        its shutdown, or a retry loop, after the exception): this is the exception line
        that ends the first Python traceback, or else the first line that names an
        error. Only the lines after the latest start's command line count (the log is
        appended to across restarts).
        """
        try:
            lines = self.log_file.read_text(errors='replace').splitlines()
        except (OSError, AttributeError):
            return None
        starts = [i for i, line in enumerate(lines) if line.startswith('$ ')]
        lines = lines[starts[-1] + 1:] if starts else lines
        for i, line in enumerate(lines):
            if line.startswith('Traceback (most recent call last)'):
                # the exception line: the first unindented line after the frames
                for cause in lines[i + 1:]:
                    if cause.strip() and not cause[0].isspace():
                        return cause.strip()
                return line.strip()
        return next((line.strip() for line in lines if _ERROR_LINE.search(line)), None)

    def _cause(self) -> str:
        """``'; first error in its log: ...'``, or ``''`` where the log names none."""
        cause = self.first_error()
        return '' if cause is None else f'; first error in its log: {cause[:500]}'
