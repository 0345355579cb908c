"""Each test here adopts the orphans of the processes it starts (``PR_SET_CHILD_SUBREAPER``).

A sandboxed program that escapes its run (double fork, ``setsid``) would be re-parented to
init, where it cannot be told apart from the runs of another test process on the machine
(``make test`` runs two). With this test process as the subreaper, such a program becomes
its child, so the leak checks (:func:`tests.test_reward.test_code.harness_processes`) look at
this process's descendants only, and still see every program that outlived its run.
"""

import ctypes
import os

import pytest

PR_SET_CHILD_SUBREAPER = 36


def _set_subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f'prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}')


def _reap_adopted_zombies() -> None:
    """Waits for the exited children of this process that no one else waits for: the
    orphans it adopted (inner ``bwrap`` processes) would stay zombies for its lifetime."""
    me = str(os.getpid())
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            fields = open(f'/proc/{entry}/stat').read().rsplit(')', 1)[1].split()
        except OSError:
            continue
        if fields[0] == 'Z' and fields[1] == me:
            try:
                os.waitpid(int(entry), os.WNOHANG)
            except ChildProcessError:
                pass


@pytest.fixture(autouse=True)
def adopt_orphans():
    """The test process is the subreaper of what it starts while the test runs; the
    orphans it adopted and that have exited are reaped afterwards."""
    _set_subreaper(True)
    yield
    _set_subreaper(False)
    _reap_adopted_zombies()
