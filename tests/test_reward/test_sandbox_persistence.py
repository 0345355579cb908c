"""Nothing of one sandbox run survives into the next: the class of cross-run memories.

A solution scored many times could search the answers one run at a time if it could keep
anything between runs. The solution below writes everything it can think of in run 1
(files in its folder, ``/tmp``, ``/dev/shm`` and its home; SysV shared memory, a
semaphore set and a message queue under fixed keys; an environment variable; a page of a
read-only standard-library file evicted from the page cache) and looks for all of it in
run 2. It must find nothing, at every kernel level, as root and as the user nobody; and
the page-cache probes themselves (``RWF_NOWAIT`` reads, ``mincore``, ``cachestat``,
``posix_fadvise``, ``madvise(MADV_PAGEOUT)``) must be refused.

Negative controls, so the test can fail: the same probes outside the sandbox work (the
seccomp filter is what refuses them), and at ``'contained'`` without an IPC namespace the
SysV objects of run 1 are there in run 2.
"""

import json
import os
import subprocess
import sys

import pytest

from gepo_xtuner.reward.sandbox.trainer import Sandbox, available_levels

from .nobody import nobody_folders, nobody_skip_reason, run_as_nobody, sandbox_copy

KEY = 0x6E7E5A17  # the SysV key run 1 uses

#: stdin 'write' (run 1) or 'read' (run 2); prints one JSON line
PERSIST = r'''
import ctypes, json, mmap, os, sys
mode = sys.stdin.read().strip()
KEY = %d
libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT = 0o1000
places = [os.path.abspath('mark'), '/tmp/gepo-mark', '/dev/shm/gepo-mark',
          os.path.join(os.path.expanduser('~'), 'gepo-mark')]
report = {'found': [], 'probes': {}}
if mode == 'write':
    for path in places:
        try:
            with open(path, 'w') as f:
                f.write('1')
        except OSError:
            pass
    libc.shmget(KEY, 4096, IPC_CREAT | 0o666)
    libc.semget(KEY, 1, IPC_CREAT | 0o666)
    libc.msgget(KEY, IPC_CREAT | 0o666)
    os.environ['GEPO_MARK'] = '1'
else:
    report['found'] += [p for p in places if os.path.exists(p)]
    for name in ('shmget', 'semget', 'msgget'):
        ident = getattr(libc, name)(KEY, *((0, 0) if name != 'msgget' else (0,)))
        if ident >= 0:
            report['found'].append(name)
            getattr(libc, name.replace('get', 'ctl'))(ident, *((0,) if name == 'semget' else ()), 0, None)
    if os.environ.get('GEPO_MARK'):
        report['found'].append('environment')
f = os.open(os.__file__, os.O_RDONLY)
def errno_of(call):
    ctypes.set_errno(0)
    try:
        result = call()
    except OSError as exc:
        return exc.errno
    return 'ok' if result is None or result >= 0 else ctypes.get_errno()
x86 = os.uname().machine == 'x86_64'
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.syscall.restype = ctypes.c_long
page = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, f, 0)  # a page of the file
vec = ctypes.create_string_buffer(1)
span, stats = (ctypes.c_uint64 * 2)(0, 4096), (ctypes.c_uint64 * 5)()
report['probes'] = {
    'fadvise': errno_of(lambda: os.posix_fadvise(f, 0, 4096, os.POSIX_FADV_DONTNEED)),
    'nowait': errno_of(lambda: os.preadv(f, [bytearray(1)], 0, os.RWF_NOWAIT)),
    'pageout': errno_of(lambda: mmap.mmap(f, 4096, prot=mmap.PROT_READ).madvise(21)),
    'mincore': errno_of(lambda: libc.syscall(27 if x86 else 232, ctypes.c_void_p(page),
                                             ctypes.c_size_t(4096), vec)),
    'cachestat': errno_of(lambda: libc.syscall(451, f, span, stats, 0)),
}
print(json.dumps(report))
''' % KEY

DENIED = {'fadvise', 'nowait', 'pageout', 'mincore', 'cachestat'}


def _twice(run) -> tuple[dict, dict]:
    first, second = run('write'), run('read')
    return first, second


def _check(level: str, first: dict, second: dict) -> None:
    assert second['found'] == [], (level, second['found'])
    for report in (first, second):
        allowed = {k for k, v in report['probes'].items() if v == 'ok'}
        assert not allowed & DENIED, (level, report['probes'])


def test_probes_work_outside_the_sandbox():
    """The negative control of the filter: the same probes in a plain process work (or fail
    for a reason of their own, never EPERM), so EPERM inside is the filter's doing."""
    done = subprocess.run([sys.executable, '-I', '-c', PERSIST], input='read', text=True,
                          capture_output=True, timeout=60, check=True)
    probes = json.loads(done.stdout.strip().splitlines()[-1])['probes']
    # EAGAIN (11) is the probe working: the page fadvise just evicted is not cached
    assert probes['nowait'] in ('ok', 11) and probes['mincore'] == 'ok', probes
    assert probes['fadvise'] == 'ok' and probes['pageout'] in ('ok', 22), probes  # 22: old kernel
    assert all(v != 1 for v in probes.values()), probes


@pytest.mark.parametrize('level', [lv for lv in ('isolated', 'contained')
                                   if available_levels()[lv] is None])
def test_nothing_survives_a_run_in_this_process(level, tmp_path):
    box = Sandbox(timeout_s=10, isolation=level, tmp_dir=str(tmp_path))

    def run(mode: str) -> dict:
        result = box.run(PERSIST, stdin=mode)
        assert result.status == 'ok', (result.status, result.stderr[-1500:])
        return json.loads(result.stdout.strip().splitlines()[-1])
    _check(level, *_twice(run))
    assert list(tmp_path.iterdir()) == []


_NOBODY = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
from boxpkg.sandbox import Sandbox, available_levels
from boxpkg.sandbox import trainer
code, boxes = sys.argv[2], sys.argv[3]
out = {'why_not': available_levels(), 'runs': {}}
def twice(level):
    box = Sandbox(timeout_s=10, isolation=level, tmp_dir=boxes)
    reports = []
    for mode in ('write', 'read'):
        result = box.run(code, stdin=mode)
        reports.append(json.loads(result.stdout.strip().splitlines()[-1])
                       if result.status == 'ok' else {'status': result.status, 'stderr': result.stderr[-800:]})
    return reports
for level in ('isolated', 'contained'):
    if out['why_not'][level] is None:
        out['runs'][level] = twice(level)
if out['why_not']['contained'] is None:  # the negative control: no IPC namespace
    trainer._UNSHARE_ARGS = tuple(a for a in trainer._UNSHARE_ARGS if a != '--ipc')
    trainer._UNSHARE_ARGS_USER = ('--map-root-user', *trainer._UNSHARE_ARGS)
    out['no_ipc_namespace'] = twice('contained')
print(json.dumps(out))
'''


@pytest.mark.skipif(nobody_skip_reason() is not None, reason=str(nobody_skip_reason()))
def test_nothing_survives_a_run_as_nobody():
    """As nobody (trainer and solution share a uid, so IPC objects and files are theirs to
    share unless a namespace or a mount separates the runs), at every kernel level; and
    at 'contained' without the IPC namespace the SysV objects do survive (the control)."""
    with nobody_folders('boxes') as (boxes,), sandbox_copy() as work:
        done = run_as_nobody(work, _NOBODY, PERSIST, boxes, timeout=240)
        leftovers = os.listdir(boxes)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not out['runs']:
        pytest.skip(f'no kernel level works for nobody here: {out["why_not"]}')
    for level, (first, second) in out['runs'].items():
        assert 'found' in first and 'found' in second, (level, first, second)
        _check(level, first, second)
    if 'no_ipc_namespace' in out:
        first, second = out['no_ipc_namespace']
        assert {'shmget', 'semget', 'msgget'} <= set(second['found']), second
    assert leftovers == []
