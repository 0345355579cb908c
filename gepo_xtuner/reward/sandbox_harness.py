"""Child side of :mod:`gepo_xtuner.reward.sandbox`: limits itself, then runs the solution.

Run by the sandbox as ``python -I sandbox_harness.py '<json spec>'`` in a fresh working
directory, with stdin/stdout/stderr already redirected to files. Standard library only.

Order matters: every limit and guard is in place before the first line of untrusted
code runs, and limits are set with hard == soft so the code cannot raise them again.

Spec keys: ``code_path``, ``ready_path``, ``result_path``, ``mode`` (``'stdin'`` or
``'call'``), ``fn_name`` and ``args`` (call mode), ``cpu_s``, ``memory_bytes``,
``max_output_bytes``, ``max_processes``, ``block_network``, ``block_processes``.
"""

import builtins
import json
import resource
import sys

# Audit events (https://docs.python.org/3/library/audit_events.html) refused by the guard.
_NETWORK_EVENTS = frozenset({'socket.__new__', 'socket.socketpair'})
_PROCESS_EVENTS = frozenset({'os.fork', 'os.forkpty', 'os.posix_spawn', 'os.spawn', 'os.exec',
                             'os.system', 'subprocess.Popen', 'os.kill', 'os.killpg',
                             'signal.pthread_kill'})
# Native escape hatches: ctypes reaches libc directly and _posixsubprocess forks without
# the subprocess.Popen audit event.
_NATIVE_MODULES = frozenset({'ctypes', '_ctypes', '_posixsubprocess'})


def _set_limit(kind: int, soft: int, hard: int | None = None) -> None:
    resource.setrlimit(kind, (soft, soft if hard is None else hard))


def _install_guard(block_network: bool, block_processes: bool) -> None:
    """An audit hook that refuses the given capabilities (cannot be removed later)."""
    events = set()
    if block_network:
        events |= _NETWORK_EVENTS
    if block_processes:
        events |= _PROCESS_EVENTS
    if not events:
        return
    modules = _NATIVE_MODULES
    # Process creation outside Python (a shell running curl) would bypass the socket
    # guard, so blocking the network also blocks processes and native calls.

    def guard(event: str, args: tuple) -> None:
        if event == 'import' and args and args[0] in modules:
            # ImportError, which libraries with optional native parts (numpy) expect
            raise ImportError(f'sandbox: importing {args[0]} is not allowed')
        if event in events or event == 'ctypes.dlopen':
            raise PermissionError(f'sandbox: {event} is not allowed')

    sys.addaudithook(guard)


def main() -> None:
    spec = json.loads(sys.argv[1])
    _set_limit(resource.RLIMIT_CORE, 0)
    _set_limit(resource.RLIMIT_FSIZE, spec['max_output_bytes'])
    _set_limit(resource.RLIMIT_NOFILE, 256)
    if spec['max_processes']:
        _set_limit(resource.RLIMIT_NPROC, spec['max_processes'])
    # SIGXCPU at the soft limit, SIGKILL one second later (a PID-namespace init
    # ignores SIGXCPU but not the kernel's SIGKILL).
    _set_limit(resource.RLIMIT_CPU, spec['cpu_s'], spec['cpu_s'] + 1)
    _set_limit(resource.RLIMIT_AS, spec['memory_bytes'])
    with open(spec['code_path'], encoding='utf-8') as f:
        source = f.read()
    with open(spec['ready_path'], 'w'):
        pass  # tells the parent that failures from here on are the solution's
    _install_guard(spec['block_network'], spec['block_processes'])
    code = compile(source, 'solution.py', 'exec')  # a SyntaxError fails the run
    if spec['mode'] == 'stdin':
        sys.argv = ['solution.py']
        exec(code, {'__name__': '__main__', '__builtins__': builtins})  # noqa: S102
        return
    namespace = {'__name__': 'solution', '__builtins__': builtins}
    exec(code, namespace)  # noqa: S102  (running it is the point)
    fn_name = spec['fn_name']
    fn = namespace.get(fn_name)
    if fn is None and isinstance(namespace.get('Solution'), type):
        fn = getattr(namespace['Solution'](), fn_name, None)  # LeetCode style
    if fn is None:
        raise NameError(f'the solution defines neither {fn_name}() nor Solution.{fn_name}()')
    value = fn(*spec['args'])
    with open(spec['result_path'], 'w', encoding='utf-8') as f:
        json.dump({'value': value}, f)


if __name__ == '__main__':
    main()
