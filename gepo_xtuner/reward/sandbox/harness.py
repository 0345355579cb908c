"""The sandboxed process's start: limits itself, then runs the solution (inside the box).

Run by :mod:`.trainer` as ``python -I -S harness.py '<json spec>'`` in the run's working
directory, with stdin/stdout/stderr already redirected to files. Standard library only
(``-S``: no ``site``, so no ``.pth`` start-up hooks; the interpreter's site-packages
directories are appended to ``sys.path`` by hand). Its modules are named for the side they
serve: :mod:`.limits` (both processes), :mod:`.solution_side` (the process that runs the
code), :mod:`.judge_side` (the test process of an assert run), :mod:`.wire` (values
between them) and :mod:`.syscall_filter` (the seccomp filter). What each side may trust:
docs/rewards.md, "What the grader trusts".

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
:mod:`.syscall_filter`'s filter), ``max_output_bytes``, ``max_processes``,
``block_network``, ``block_processes``, ``site_dirs``, ``landlock`` (None or the rules of
:func:`.limits.apply_landlock`), ``judge_landlock`` (the test process's own rules, or
None without Landlock), ``trace_judge`` (record the test process's reads) and ``fs_guard`` (None or ``{'read': [...], 'write': [...],
'read_files': [...], 'metadata_only': bool}``: the Python-level file guard; at the weaker
levels it checks every file access and refuses process creation, with Landlock only the
metadata changes Landlock does not control).
"""

import builtins
import json
import os
import resource
import sys

if __package__:  # imported by the trainer (gepo_xtuner.reward.sandbox)
    from . import judge_side, limits, solution_side, wire
    from . import syscall_filter as seccomp
else:
    # run as the sandbox's script (-I: no package, no script directory on sys.path): the
    # modules beside this file are imported before any restriction, and the directory is
    # taken off sys.path again so that the code cannot import the package's other modules
    # by name
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import judge_side
        import limits
        import solution_side
        import syscall_filter as seccomp
        import wire
    finally:
        del sys.path[0]


def run_assert_tests(spec: dict, control) -> None:
    """Asserts mode: the solution and the tests in two processes (:mod:`.solution_side`,
    :mod:`.judge_side`).

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
    limits.set_dumpable(False)  # before the fork: no moment in which the solution could attach
    test_pid = os.getpid()
    to_solution_r, to_solution_w = os.pipe()
    to_tests_r, to_tests_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            for fd in (control.fileno(), spec['tests_fd'], to_solution_w, to_tests_r):
                os.close(fd)
            solution_side.solution_process(spec, wire.Channel(to_solution_r, to_tests_w),
                                           test_pid)
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
    judge_side.judge_process(spec, control, wire.Channel(to_tests_r, to_solution_w), pid)


def main() -> None:
    spec = json.loads(sys.argv[1])
    limits.set_limit(resource.RLIMIT_CORE, 0)
    limits.set_limit(resource.RLIMIT_FSIZE, spec['max_output_bytes'])
    limits.set_limit(resource.RLIMIT_NOFILE, 256)
    if spec['max_processes']:
        # counted per user: the kernel enforces it for any uid but root, which is why a
        # root trainer's sandbox runs under a uid of its own (``drop_to``)
        limits.set_limit(resource.RLIMIT_NPROC, spec['max_processes'])
    # SIGXCPU at the soft limit, SIGKILL one second later (a PID-namespace init
    # ignores SIGXCPU but not the kernel's SIGKILL).
    limits.set_limit(resource.RLIMIT_CPU, spec['cpu_s'], spec['cpu_s'] + 1)
    limits.join_cgroups(spec.get('cgroup_fds', []))
    control = os.fdopen(spec['control_fd'], 'w', encoding='utf-8')
    if spec.get('landlock') is not None:
        limits.apply_landlock(**spec['landlock'])
    if spec['mode'] == 'asserts':
        run_assert_tests(spec, control)
        return
    with os.fdopen(spec['code_fd'], encoding='utf-8') as f:
        source = f.read()
    if spec.get('drop_to') is not None:
        uid, gid = spec['drop_to']
        limits.drop_privileges(uid, gid, spec.get('own', []))
    if spec.get('seccomp'):
        seccomp.apply_filter()
    limits.last_steps(spec)
    control.write('ready\n')  # tells the parent that failures from here on are the solution's
    control.flush()
    solution_side.install_guard(spec['block_network'], spec['block_processes'],
                                spec.get('fs_guard'))
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
        value = wire.encode_value(fn(*args))  # TypeError for a value of the code's own class
        control.write(json.dumps({'value': value}) + '\n')
        control.flush()


if __name__ == '__main__':
    main()
