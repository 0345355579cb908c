"""A preloaded Python for the suite's many ``python -m xtuner.tools.train`` and tool runs.

Each such run is a real Python program run as its own process, but a fresh interpreter pays
8-12 s of CPU importing torch, transformers, mmengine and xtuner before the program's first
line; the suite starts about a hundred of them. Here one *zygote* process per test process
imports those third-party packages once (running no torch op, so no OpenMP pool exists yet)
and forks a child for each run. The child takes the run's argv, environment, working directory and
stdio, runs the module or script as ``__main__`` (``runpy``, as ``python -m`` / ``python
path`` do), runs the exit handlers and exits with the program's status. What the run does
after its imports is what a fresh process does; what differs is only that the packages
above were imported before the program started.

Falls back to a fresh interpreter (``subprocess.run``) where that difference could matter:

* a command that is not ``<this python> -m MODULE ...`` or ``<this python> SCRIPT.py ...``;
* the zygote could not import its packages under the run's ``PYTHONPATH`` (each distinct
  ``PYTHONPATH``, an overlay such as transformers 5, has a zygote of its own);
* the machine has a GPU and the imports touched CUDA, so a forked child could not use it;
* ``GEPO_TEST_FRESH_PROCESSES=1`` in the environment of the test run (every run fresh: the
  comparison that shows the two agree).

Tests whose subject is the process start itself (import-time warnings, start-up time,
what a fresh install imports) call ``subprocess`` directly and never come here.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from collections.abc import Callable
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# what every training run and most tools import first: third-party packages only, and none
# may run a torch op. This project's own package is not among them: importing it applies
# shims that depend on the program's argv (gepo_xtuner.compat), so each run imports it.
PRELOAD = ('torch', 'numpy', 'safetensors.torch', 'transformers', 'mmengine', 'mmengine.config',
           'mmengine.runner', 'xtuner', 'xtuner.tools.train',
           'transformers.models.qwen2.modeling_qwen2')


def _serve(sock_path: str) -> None:
    """The zygote: imports, then forks one child per request until its parent goes away."""
    parent = os.getppid()
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if p != here]  # not the tests' folder
    # the pipe to the client carries the handshake only: what the imports print (DeepSpeed's
    # accelerator notice, under its overlay) goes to the zygote's stderr
    handshake = os.fdopen(os.dup(1), 'w')
    os.dup2(2, 1)
    for name in PRELOAD:
        importlib.import_module(name)
    if any(name == 'gepo_xtuner' or name.startswith('gepo_xtuner.') for name in sys.modules):
        sys.exit('a preloaded package imported gepo_xtuner: runs need fresh processes')
    if _forks_lose_cuda():
        sys.exit('a preloaded package touched CUDA: runs need fresh processes')
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(8)
    handshake.write('ready\n')
    handshake.close()
    children: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        ready, _, _ = select.select([srv], [], [], 0.05)
        if ready:
            conn, _ = srv.accept()
            request = json.loads(conn.makefile('r').readline())
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                srv.close()
                conn.close()
                _child(request)  # never returns
            children[pid] = conn
            conn.sendall((json.dumps({'pid': pid}) + '\n').encode())
        for pid, conn in list(children.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                with contextlib.suppress(OSError):
                    conn.sendall((json.dumps(
                        {'returncode': os.waitstatus_to_exitcode(status)}) + '\n').encode())
                conn.close()
                del children[pid]
    for pid in children:  # the test process died: take its runs with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _forks_lose_cuda() -> bool:
    """Whether a child forked now would lack a GPU it could use ("Cannot re-initialize CUDA
    in forked subprocess", seen for every forked training run on an H100).

    Torch marks forks bad once the CUDA driver was asked anything (a device count, not only
    an initialised context); the preloaded imports do that on every machine with a CUDA
    build of torch. Only a forked child can tell, so one is forked to ask. Where the
    machine has no GPU, a bad fork loses nothing and the zygote serves.
    """
    torch = sys.modules['torch']
    if not torch.backends.cuda.is_built():
        return False
    pid = os.fork()
    if pid == 0:
        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    bad = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0
    return bad and torch.cuda.device_count() > 0  # forks are already bad: asking costs nothing


def _child(request: dict[str, Any]) -> None:
    """Becomes the requested program: own session, stdio, cwd, environment, argv."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request['stdout']), (2, request['stderr'])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(out, fd)
            os.close(out)
        os.chdir(request['cwd'])
        os.environ.clear()
        os.environ.update(request['env'])
        _threads_as_a_fresh_interpreter()
        # as a fresh interpreter: PYTHONPATH entries first, then the script's folder first
        extra = [p for p in request['env'].get('PYTHONPATH', '').split(os.pathsep) if p]
        sys.path[:] = extra + [p for p in sys.path if p not in extra]
        sys.argv = list(request['argv'])
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            if request.get('module'):
                sys.path.insert(0, request['cwd'])  # python -m puts the cwd first
                runpy.run_module(request['module'], run_name='__main__', alter_sys=True)
            else:
                sys.path.insert(0, str(Path(request['script']).resolve().parent))
                runpy.run_path(request['script'], run_name='__main__')
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001 - printed as the interpreter prints it
            traceback.print_exc()
            code = 1
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()  # noqa: SLF001 - what interpreter exit runs
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _threads_as_a_fresh_interpreter() -> None:
    """Torch's thread count as a fresh interpreter with this environment would pick it.

    OpenMP reads ``OMP_NUM_THREADS`` when torch is loaded, which was in the zygote (started
    without it, so at the machine's default); a run whose environment names a count gets it
    here, one that names none keeps that default.
    """
    torch = sys.modules.get('torch')
    if torch is None:
        return
    for name in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS'):
        value = os.environ.get(name, '')
        if value.isdigit() and int(value) > 0:
            torch.set_num_threads(int(value))
            return


class Zygote:
    """The client side: one zygote per test process and ``PYTHONPATH``, started on first use
    with that ``PYTHONPATH`` (an overlay such as transformers 5 gets a zygote that imported
    the overlay's packages)."""

    def __init__(self, pythonpath: str) -> None:
        self.pythonpath = pythonpath
        self.failed = False  # it could not import PRELOAD here: runs go to fresh processes
        self._proc: subprocess.Popen | None = None
        self._dir = tempfile.mkdtemp(prefix='gepo-zygote-')
        self._sock = os.path.join(self._dir, 'sock')
        self._lock = threading.Lock()

    def _start(self) -> None:
        env = {k: v for k, v in os.environ.items()
               if k not in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS')}  # set per run
        env['PYTHONPATH'] = self.pythonpath
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._sock)
        self._proc = subprocess.Popen([sys.executable, __file__, '--serve', self._sock],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      env=env, cwd=ROOT, text=True)
        for line in self._proc.stdout:  # lines before it: printed at interpreter start
            if line.strip() == 'ready':
                break
        else:  # it exited: its imports failed
            self._proc.wait()
            self.failed = True
            return
        atexit.register(self.close)

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
        self._proc = None

    def run(self, request: dict[str, Any], timeout: float | None,
            on_start: Callable[[int], None] | None = None) -> tuple[int, str, str] | None:
        """Runs ``request`` in a forked child; None where this zygote cannot start.
        ``on_start`` gets the child's pid (its process group) as soon as it exists."""
        with self._lock:
            if not self.failed and (self._proc is None or self._proc.poll() is not None):
                self._start()
            if self.failed:
                return None
        with tempfile.TemporaryDirectory(dir=self._dir) as tmp:
            request = dict(request, stdout=f'{tmp}/out', stderr=f'{tmp}/err')
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(self._sock)
                conn.sendall((json.dumps(request) + '\n').encode())
                reader = conn.makefile('r')
                pid = json.loads(reader.readline())['pid']
                if on_start is not None:
                    on_start(pid)
                deadline = None if timeout is None else time.monotonic() + timeout
                timed_out = False
                while True:
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    ready, _, _ = select.select([conn], [], [], left)
                    if ready:
                        returncode = json.loads(reader.readline())['returncode']
                        break
                    timed_out = True
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                    deadline = None
            out = Path(f'{tmp}/out').read_text(errors='replace')
            err = Path(f'{tmp}/err').read_text(errors='replace')
        if timed_out:
            raise subprocess.TimeoutExpired(request['argv'], timeout, out, err)
        return returncode, out, err


_ZYGOTES: dict[str, Zygote] = {}


def _plan(cmd: list[str], env: dict[str, str]) -> dict[str, Any] | None:
    """The zygote request for ``cmd``, or None where a fresh interpreter is needed."""
    if os.environ.get('GEPO_TEST_FRESH_PROCESSES') == '1':
        return None
    if not cmd or os.path.abspath(cmd[0]) != os.path.abspath(sys.executable):
        return None
    if len(cmd) >= 3 and cmd[1] == '-m':
        return {'module': cmd[2], 'argv': [cmd[2], *cmd[3:]]}
    if len(cmd) >= 2 and str(cmd[1]).endswith('.py') and not str(cmd[1]).startswith('-'):
        return {'script': str(cmd[1]), 'argv': [str(c) for c in cmd[1:]]}
    return None


def run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
        timeout: float | None = None, check: bool = False, capture_output: bool = True,
        text: bool = True) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, ...)`` through the zygote
    where it can serve the command, a fresh interpreter otherwise.

    Raises:
        ValueError: ``capture_output`` or ``text`` is False (only captured text is served).
        subprocess.TimeoutExpired: the run took longer than ``timeout`` (it was killed).
        subprocess.CalledProcessError: ``check`` and a non-zero exit.
    """
    if not (capture_output and text):
        raise ValueError('preloaded.run captures text output only')
    cmd = [str(c) for c in cmd]
    env = dict(os.environ if env is None else env)
    plan = _plan(cmd, env)
    proc = None
    if plan is not None:
        request = dict(plan, env=env, cwd=str(Path(cwd or os.getcwd()).resolve()))
        pythonpath = os.pathsep.join(filter(None, (env.get('PYTHONPATH'), str(ROOT))))
        zygote = _ZYGOTES.setdefault(pythonpath, Zygote(pythonpath))
        done = zygote.run(request, timeout)
        if done is not None:
            proc = subprocess.CompletedProcess(cmd, *done)
    if proc is None:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd,
                              timeout=timeout, check=False)
    if check:
        proc.check_returncode()
    return proc


def run_ranks(script: str | Path, args: list[str], nproc: int, *, env: dict[str, str],
              cwd: str | Path, timeout: float) -> str | None:
    """``nproc`` processes of ``python script args``, forked from the zygote, with the
    environment torchrun gives its workers on one node (``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ...); like
    torchrun, the first failing rank ends the others. Returns every rank's stdout and
    stderr, rank 0 first; None where the zygote cannot serve ``env`` (the caller then
    launches for real).

    Raises:
        subprocess.TimeoutExpired: the ranks ran past ``timeout`` (all were killed).
    """
    if os.environ.get('GEPO_TEST_FRESH_PROCESSES') == '1':
        return None
    pythonpath = os.pathsep.join(filter(None, (env.get('PYTHONPATH'), str(ROOT))))
    zygote = _ZYGOTES.setdefault(pythonpath, Zygote(pythonpath))
    port = env['MASTER_PORT']  # the caller's free port, as torchrun's --master_port
    pids: dict[int, int] = {}
    results: dict[int, tuple[int, str, str] | None | BaseException] = {}
    lock = threading.Lock()

    def end_others(rank: int) -> None:
        with lock:
            for other, pid in pids.items():
                if other != rank:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGTERM)

    def one(rank: int) -> None:
        rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK='0',
                        ROLE_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                        ROLE_WORLD_SIZE=str(nproc), MASTER_ADDR='127.0.0.1', MASTER_PORT=port,
                        TORCHELASTIC_RESTART_COUNT='0', TORCHELASTIC_MAX_RESTARTS='0')
        rank_env.setdefault('OMP_NUM_THREADS', '1')  # torchrun's default for nproc > 1
        request = {'script': str(script), 'argv': [str(script), *map(str, args)],
                   'env': rank_env, 'cwd': str(Path(cwd).resolve())}

        def started(pid: int) -> None:
            with lock:
                pids[rank] = pid
        try:
            results[rank] = done = zygote.run(request, timeout, started)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            results[rank] = exc
            end_others(rank)
            return
        if done is not None and done[0] != 0:
            end_others(rank)

    threads = [threading.Thread(target=one, args=(rank,)) for rank in range(nproc)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for rank in range(nproc):
        if isinstance(results[rank], BaseException):
            raise results[rank]
    if any(results[rank] is None for rank in range(nproc)):
        return None
    return ''.join(results[rank][1] + results[rank][2] for rank in range(nproc))


if __name__ == '__main__' and sys.argv[1:2] == ['--serve']:
    _serve(sys.argv[2])
