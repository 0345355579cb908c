"""Removing a run's folder never raises on what the solution left, and leaves nothing.

A solution controls its folder: thousands of nested folders (``shutil.rmtree`` recursed
once per level and raised ``RecursionError`` out of ``Sandbox.run``), paths past
``PATH_MAX``, folders it made unreadable (``chmod 000`` of its folder and of the one
above), many files, links to host folders. The removal (``trainer._remove_tree``) takes
the tree apart without recursion and long paths, restores permissions, is bounded in
time and reports what it could not remove once. Tested on the function (as root and as
the user nobody) and through ``Sandbox.run`` at every kernel level this machine has, as
nobody (the trainer that shares no uid with a root's per-run users).
"""

import json
import os
import tempfile
import time

import pytest

from gepo_xtuner.reward.sandbox import trainer as sandbox_module

from .nobody import nobody_folders, nobody_skip_reason, run_as_nobody, sandbox_copy

#: builds the hostile tree under sys.argv[-1] (standard library only: runs as nobody too)
BUILD = r'''
import os, sys
root = sys.argv[-1]
os.makedirs(root, exist_ok=True)
fd = os.open(root, os.O_RDONLY)
for i in range(1500):  # 1500 levels of 20-letter names: 31,500 bytes, past PATH_MAX
    os.mkdir('d' * 20, dir_fd=fd)
    inner = os.open('d' * 20, os.O_RDONLY, dir_fd=fd)
    f = os.open('f', os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=inner)
    os.write(f, b'x')
    os.close(f)
    if i % 300 == 299:
        os.fchmod(fd, 0)  # unreadable folders on the way down
    os.close(fd)
    fd = inner
os.close(fd)
for i in range(2000):
    open(os.path.join(root, f'many{i}'), 'w').close()
os.makedirs(os.path.join(root, 'locked', 'inner'))
os.chmod(os.path.join(root, 'locked', 'inner'), 0)
os.chmod(os.path.join(root, 'locked'), 0o500)
os.symlink(sys.argv[-2], os.path.join(root, 'link'))  # a folder outside: must survive
os.chmod(root, 0)
'''

REMOVE = r'''
import json, sys, time
sys.path.insert(0, sys.argv[1])
from boxpkg.sandbox.trainer import _remove_tree
start = time.monotonic()
left = _remove_tree(sys.argv[-1])
print(json.dumps({'left': left, 'seconds': time.monotonic() - start}))
'''


@pytest.fixture
def hostile(tmp_path_factory):
    """``(run folder, host folder)``: the hostile tree is built in a folder of its own,
    outside pytest's temporary directories (whose own clean-up recurses), and removed
    afterwards whatever the test did."""
    import subprocess
    import sys
    base = tempfile.mkdtemp(prefix='gepo-hostile-')
    outside = os.path.join(base, 'host')
    os.mkdir(outside)
    with open(os.path.join(outside, 'keep.txt'), 'w') as f:
        f.write('keep')
    root = os.path.join(base, 'run')
    subprocess.run([sys.executable, '-I', '-c', BUILD, outside, root], check=True, timeout=120)
    yield root, outside
    sandbox_module._remove_tree(base)


def test_removal_takes_any_tree_apart_without_raising(hostile):
    root, outside = hostile
    start = time.monotonic()
    assert sandbox_module._remove_tree(root) == 0
    assert not os.path.exists(root) and time.monotonic() - start < 30
    # the link was removed, not followed
    assert open(os.path.join(outside, 'keep.txt')).read() == 'keep'


def test_what_cannot_be_removed_in_time_is_reported_once(hostile, monkeypatch):
    root, _ = hostile
    lines = []
    monkeypatch.setattr(sandbox_module, 'print_log', lambda msg, **kw: lines.append(msg))
    left = sandbox_module._remove_tree(root, deadline_s=0.0)
    assert left > 0 and os.path.exists(root)
    assert len(lines) == 1 and 'time bound reached' in lines[0] and root in lines[0]
    assert sandbox_module._remove_tree(root) == 0 and not os.path.exists(root)


def test_a_missing_folder_is_nothing_to_do(tmp_path):
    assert sandbox_module._remove_tree(str(tmp_path / 'never')) == 0


_SOLUTION = r'''
import os
fd = os.open('.', os.O_RDONLY)
for i in range(3000):
    os.mkdir('d' * 30, dir_fd=fd)
    inner = os.open('d' * 30, os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = inner
for folder in ('..', '.'):
    try:
        os.chmod(folder, 0)
    except OSError:
        pass
print('done')
'''

_NOBODY_RUNS = r'''
import json, os, sys
sys.path.insert(0, sys.argv[1])
from boxpkg.sandbox import Sandbox, available_levels
boxes = sys.argv[2]
solution = sys.argv[3]
why_not = available_levels()
out = {'why_not': why_not, 'runs': {}}
for level in ('isolated', 'contained'):
    if why_not[level] is not None:
        continue
    box = Sandbox(timeout_s=10, disk_mb=64, isolation=level, tmp_dir=boxes)
    try:
        result = box.run(solution)
        out['runs'][level] = [result.status, result.stdout, os.listdir(boxes)]
    except BaseException as exc:
        out['runs'][level] = ['raised', f'{type(exc).__name__}: {exc}', os.listdir(boxes)]
print(json.dumps(out))
'''


@pytest.mark.skipif(nobody_skip_reason() is not None, reason=str(nobody_skip_reason()))
def test_as_nobody_a_deep_tree_and_chmod_000_neither_raise_nor_stay():
    """As the user nobody (the trainer and the solution then share a uid): the function on
    the hostile tree, and a solution that leaves 3000 nested folders and makes its folder
    and the one above unreadable, at every kernel level: ``run`` returns, and the folder of
    the run is gone."""
    with nobody_folders('boxes', 'host') as (boxes, outside), sandbox_copy() as work:
        tree = os.path.join(os.path.dirname(boxes), 'tree')  # built by nobody, in nobody's
        with open(os.path.join(outside, 'keep.txt'), 'w') as f:
            f.write('keep')
        done = run_as_nobody(work, BUILD, outside, tree, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        done = run_as_nobody(work, REMOVE, tree, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout.strip().splitlines()[-1])['left'] == 0
        assert not os.path.exists(tree)
        assert open(os.path.join(outside, 'keep.txt')).read() == 'keep'
        done = run_as_nobody(work, _NOBODY_RUNS, boxes, _SOLUTION, timeout=180)
        assert done.returncode == 0, done.stderr[-2000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
    if not out['runs']:
        pytest.skip(f'no kernel level works for nobody here: {out["why_not"]}')
    for level, (status, stdout, left) in out['runs'].items():
        assert status != 'raised', (level, stdout)
        assert left == [], (level, left)


def test_disk_use_is_counted_however_deep_the_path(hostile):
    """The disk check walks the tree with one folder open at a time: an 8 MiB file at the
    bottom of 1500 levels (past PATH_MAX, where ``os.scandir(path)`` fails) is counted."""
    import subprocess
    import sys
    root, _ = hostile
    before = sandbox_module._tree_bytes(root)
    write = ('import os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\n'
             'os.chmod(sys.argv[1], 0o700)\n'
             'while True:\n'
             '    try:\n'
             '        os.chmod("d" * 20, 0o700, dir_fd=fd)\n'
             '        nxt = os.open("d" * 20, os.O_RDONLY, dir_fd=fd)\n'
             '    except FileNotFoundError:\n'
             '        break\n'
             '    os.close(fd)\n'
             '    fd = nxt\n'
             'f = os.open("big", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd)\n'
             'os.write(f, b"x" * (8 << 20))\n')
    subprocess.run([sys.executable, '-I', '-c', write, root], check=True, timeout=60)
    after = sandbox_module._tree_bytes(root)
    assert after - before >= 8 << 20, (before, after)


_DEEP_WRITE = r'''
import os
fd = os.open('.', os.O_RDONLY)
for i in range(300):  # 300 levels of 240 letters: 72,000 bytes of path
    os.mkdir('d' * 240, dir_fd=fd)
    inner = os.open('d' * 240, os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = inner
for i in range(40):
    f = os.open(f'f{i}', os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd)
    os.write(f, b'x' * (1 << 20))
    os.close(f)
print('wrote 40 MiB')
'''

_NOBODY_DISK = r'''
import json, os, sys
sys.path.insert(0, sys.argv[1])
from boxpkg.sandbox import Sandbox, available_levels
from boxpkg.sandbox.trainer import UNCOUNTABLE, _tree_bytes
code, boxes, hidden = sys.argv[2], sys.argv[3], sys.argv[4]
out = {'why_not': available_levels(), 'runs': {}}
for level in ('isolated', 'contained'):
    if out['why_not'][level] is None:
        result = Sandbox(timeout_s=20, disk_mb=16, isolation=level, tmp_dir=boxes).run(code)
        out['runs'][level] = [result.status, result.stdout, os.listdir(boxes)]
os.makedirs(os.path.join(hidden, 'secret'))
os.chmod(os.path.join(hidden, 'secret'), 0)  # the code hides a folder from the counter
out['hidden'] = _tree_bytes(hidden) == UNCOUNTABLE
os.chmod(os.path.join(hidden, 'secret'), 0o700)
print(json.dumps(out))
'''


@pytest.mark.skipif(nobody_skip_reason() is not None, reason=str(nobody_skip_reason()))
def test_as_nobody_the_disk_limit_holds_however_deep_the_path():
    """40 MiB written 300 levels down (72,000 bytes of path) with ``disk_mb`` 16: the run
    ends at the disk limit at every level (at 'contained' the tree is on the host's disk
    and the walk must reach it); a folder the counter cannot open counts as over."""
    with nobody_folders('boxes', 'hidden') as (boxes, hidden), sandbox_copy() as work:
        done = run_as_nobody(work, _NOBODY_DISK, _DEEP_WRITE, boxes, hidden, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out['hidden']
    if not out['runs']:
        pytest.skip(f'no kernel level works for nobody here: {out["why_not"]}')
    for level, (status, stdout, left) in out['runs'].items():
        # 'isolated': a tmpfs of disk_mb, full means ENOSPC (the write fails); 'contained':
        # the host's disk, the walk finds the bytes and ends the run
        # (the check runs every 50 ms: the writes may finish before it ends the run)
        if level == 'isolated':
            assert status == 'error' and 'wrote' not in stdout, (level, status, stdout)
        else:
            assert status == 'disk_limit', (level, status, stdout)
        assert left == [], (level, left)
