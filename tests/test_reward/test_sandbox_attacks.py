"""The sandbox as a security boundary: attacks by a program written to break it.

Run as the suite runs (root in CI and in many training containers) and, where the machine
allows, as an unprivileged user. Every attack is a real program in a real sandbox at each
level here that claims to hold against hostile code (``isolated``, ``contained``); each must
be contained, score 0, leave the host unchanged (kernel settings, the trainer's files) and
leave nothing behind (processes, working directories, cgroups). Storms must stop at the
run's limit, never at the machine's.
"""

import json
import os
from pathlib import Path

import pytest

import gepo_xtuner.reward.sandbox.trainer as sandbox_module
from gepo_xtuner.reward import CodeReward
from gepo_xtuner.reward.sandbox import (UID_BASE, UID_SLOTS, Sandbox, available_levels,
                                        cgroup_support)

from .test_code import harness_processes
from .nobody import nobody_skip_reason, run_as_nobody, sandbox_copy

WHY_NOT = available_levels()
SAFE_LEVELS = [level for level in ('isolated', 'contained') if WHY_NOT[level] is None]
PWNED = {'tests': [{'input': '', 'output': 'PWNED\n'}]}
CGROUPS = cgroup_support()
KERNEL_SETTINGS = ('/proc/sys/kernel/core_pattern', '/proc/sys/kernel/pid_max',
                   '/proc/sys/kernel/panic', '/proc/sys/vm/drop_caches')

pytestmark = pytest.mark.skipif(not SAFE_LEVELS, reason=f'no kernel containment here: {WHY_NOT}')

# Clears every set or frozenset of audit-event names reachable from the garbage collector
# (the closure of an audit hook that refuses events); prints how many it emptied.
GC_BYPASS = '''
import gc
emptied = 0
for obj in gc.get_objects():
    if type(obj) is set and ('os.fork' in obj or 'socket.__new__' in obj or 'open' in obj):
        obj.clear(); emptied += 1
    elif type(obj) is dict and 'os.fork' in obj:
        obj.clear(); emptied += 1
    if callable(obj) and getattr(obj, '__closure__', None):
        for cell in obj.__closure__:
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if isinstance(value, frozenset) and ('os.fork' in value or 'ctypes' in value):
                cell.cell_contents = frozenset(); emptied += 1
'''

FORK_STORM = '''
import os, time
n = 0
for _ in range(300):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(10)
        os._exit(0)
    n += 1
print(n, flush=True)
if n >= 300:
    print("PWNED")
'''

THREAD_STORM = '''
import threading, time
threading.stack_size(64 << 10)
n = 0
for _ in range(1000):
    try:
        threading.Thread(target=time.sleep, args=(10,), daemon=True).start()
    except RuntimeError:
        break
    n += 1
print(n, flush=True)
if n >= 1000:
    print("PWNED")
import os
os._exit(0)
'''

# Three children each hold 400 MiB (under the 1 GiB per-process address-space limit);
# together 1.2 GiB. Prints how many hold their memory at the same time: those that
# reported their allocation and are still alive (the kernel may kill one that had
# already reported, to make room for the next).
MULTI_PROCESS_MEMORY = '''
import os, select, time
r, w = os.pipe()
children = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        block = b"x" * (400 << 20)
        os.write(w, b"x")
        time.sleep(20)
        os._exit(0)
    children.append(pid)
os.close(w)
reported = 0
deadline = time.time() + 4
while time.time() < deadline and reported < 3:
    if select.select([r], [], [], 0.1)[0]:
        chunk = os.read(r, 3)
        if not chunk:
            break
        reported += len(chunk)
time.sleep(0.5)
held = sum(os.waitpid(pid, os.WNOHANG) == (0, 0) for pid in children) if reported == 3 else 0
print(held, flush=True)
if held == 3:
    print("PWNED")
'''

PROC_SYS_WRITE = '''
import os
writable = []
for base, dirs, files in os.walk("/proc/sys"):
    for name in files:
        path = os.path.join(base, name)
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            continue
        writable.append(path)
        os.close(fd)
for path in ("/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger"):
    try:
        with open(path, "w") as f:
            f.write("|/bin/true" if "core" in path else "h")
        writable.append(path + " (written)")
    except OSError:
        pass
print(len(writable), writable[:5], flush=True)
if writable:
    print("PWNED")
'''

KEYRINGS = '''
lines = []
for path in ("/proc/keys", "/proc/key-users"):
    try:
        lines += open(path).read().splitlines()
    except OSError:
        pass
print(len(lines), lines[:3], flush=True)
if lines:
    print("PWNED")
'''


def _kernel_settings() -> dict[str, str]:
    out = {}
    for path in KERNEL_SETTINGS:
        try:
            out[path] = Path(path).read_text()
        except OSError:
            out[path] = '<unreadable>'
    return out


def _uid_processes(uids: set[int]) -> list[int]:
    """Live processes owned by one of ``uids``."""
    pids = []
    for entry in os.scandir('/proc'):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid in uids:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.fixture(params=SAFE_LEVELS)
def box(request, tmp_path, monkeypatch):
    """A sandbox at one level; afterwards: host unchanged, nothing of its runs left behind
    (the uids and cgroups its runs used are recorded, so that other sandboxes running on
    the machine at the same time do not count)."""
    uids, cgroup_dirs = set(), []
    lease_init, cgroups_init = sandbox_module._UidLease.__init__, sandbox_module._Cgroups.__init__

    def record_lease(self, *args, **kwargs):
        lease_init(self, *args, **kwargs)
        uids.add(self.uid)

    def record_cgroups(self, *args, **kwargs):
        cgroups_init(self, *args, **kwargs)
        cgroup_dirs.extend(self.dirs)

    monkeypatch.setattr(sandbox_module._UidLease, '__init__', record_lease)
    monkeypatch.setattr(sandbox_module._Cgroups, '__init__', record_cgroups)
    settings = _kernel_settings()
    boxes = tmp_path / 'boxes'
    boxes.mkdir()
    sandbox = Sandbox(timeout_s=3, memory_mb=1024, max_processes=32, isolation=request.param,
                      tmp_dir=str(boxes))
    yield sandbox
    assert _kernel_settings() == settings, 'a kernel setting changed'
    assert harness_processes() == [], 'a sandboxed process survived its run'
    assert _uid_processes(uids) == [], "a process of a run's uid survived it"
    assert [d for d in cgroup_dirs if os.path.exists(d)] == [], 'a per-run cgroup was left'
    assert list(boxes.iterdir()) == [], 'a working directory was left behind'
    if os.geteuid() == 0:
        assert uids and all(UID_BASE <= u < UID_BASE + UID_SLOTS for u in uids)


def _score(sandbox: Sandbox, code: str) -> float:
    reward = CodeReward(isolation=sandbox.isolation)
    reward.sandbox = sandbox  # the fixture's, whose leftovers it checks
    return reward(f'```python\n{code}\n```', PWNED)


def _count(result) -> int:
    return int(result.stdout.split()[0]) if result.stdout.strip() else 0


def test_the_pwned_check_can_fail(box):
    """The harmless twin scores 1: every 0 below is containment, not a broken check."""
    assert _score(box, 'print("PWNED")') == 1.0


def test_kernel_settings_are_read_only(box):
    """Every file under /proc/sys, core_pattern and the SysRq trigger: none writable."""
    result = box.run(PROC_SYS_WRITE)
    assert result.status == 'ok', result.stderr
    assert _count(result) == 0, result.stdout
    assert _score(box, PROC_SYS_WRITE) == 0.0


def test_no_keyrings_of_the_host(box):
    result = box.run(KEYRINGS)
    assert _count(result) == 0, result.stdout
    assert _score(box, KEYRINGS) == 0.0


def test_code_never_runs_as_root(box):
    result = box.run('import os\nprint(os.getresuid(), os.getresgid(), os.getgroups())\n'
                     'print(open("/proc/self/status").read().split("CapEff:")[1].split()[0])')
    ids, caps = result.stdout.splitlines()
    assert '0' not in ids.replace('(', ' ').replace(')', ' ').replace(',', ' ').split()
    assert int(caps, 16) == 0
    assert box.run('import os\nos.setuid(0)').status == 'error'


@pytest.mark.parametrize('storm', ['fork', 'thread'])
@pytest.mark.parametrize('bypass', [False, True], ids=['plain', 'after_gc_bypass'])
def test_storms_stop_at_the_run_limit(box, storm, bypass):
    """Forks or threads until refused, with or without first clearing any audit hook
    reachable from the garbage collector: the kernel stops it at ``max_processes``."""
    code = (GC_BYPASS if bypass else '') + (FORK_STORM if storm == 'fork' else THREAD_STORM)
    result = box.run(code)
    assert 'PWNED' not in result.stdout
    reached = _count(result)
    assert 0 < reached < box.max_processes, (reached, result.stderr[-500:])
    assert _score(box, code) == 0.0


@pytest.mark.skipif(not isinstance(CGROUPS, dict), reason=f'no per-run cgroup here: {CGROUPS}')
def test_memory_of_all_processes_together_is_limited(box):
    """Three children of 400 MiB each fit the per-process limit (1 GiB) but not the
    run's total: the memory cgroup kills one before all three hold their memory, also
    after any audit hook was cleared. With a 2 GiB total the same program holds all
    three (the limit is what stopped it)."""
    code = GC_BYPASS + MULTI_PROCESS_MEMORY
    box.timeout_s = 15
    result = box.run(code)
    assert 'PWNED' not in result.stdout, result
    assert _count(result) < 3, result
    assert _score(box, code) == 0.0
    roomy = Sandbox(timeout_s=15, memory_mb=2048, isolation=box.isolation, tmp_dir=box.tmp_dir)
    assert _count(roomy.run(code)) == 3


def test_a_uid_is_never_shared_by_concurrent_runs(box):
    """Runs in parallel threads each get a uid of their own (RLIMIT_NPROC counts per uid)."""
    if os.geteuid() != 0:
        pytest.skip('a non-root trainer runs the code under its own uid')
    from concurrent.futures import ThreadPoolExecutor
    code = 'import os, time\nprint(os.getuid())\ntime.sleep(0.5)'
    with ThreadPoolExecutor(6) as pool:
        uids = [int(r.stdout) for r in pool.map(lambda _: box.run(code), range(6))]
    assert len(set(uids)) == 6 and all(UID_BASE <= u < UID_BASE + UID_SLOTS for u in uids)


# ------------------------------------------------------------- as an unprivileged user

_NOBODY_SCRIPT = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
from boxpkg.sandbox import Sandbox, available_levels
attacks = json.loads(sys.argv[2])
why_not = available_levels()
out = {'why_not': why_not, 'cases': {}}
for level in ('isolated', 'contained'):
    if why_not[level] is not None:
        continue
    box = Sandbox(timeout_s=3, max_processes=32, isolation=level)
    out['cases'][level] = {}
    for name, code in attacks.items():
        r = box.run(code)
        out['cases'][level][name] = [r.status, r.stdout]
print(json.dumps(out))
'''


@pytest.mark.skipif(nobody_skip_reason() is not None, reason=str(nobody_skip_reason()))
def test_attacks_as_an_unprivileged_trainer():
    """The same attacks with the trainer itself running as ``nobody`` (the sandbox
    module and the bwrap binary copied where nobody can read them)."""
    settings = _kernel_settings()
    with sandbox_copy() as work:
        attacks = {'proc_sys': PROC_SYS_WRITE, 'keys': KEYRINGS,
                   'fork': GC_BYPASS + FORK_STORM, 'thread': GC_BYPASS + THREAD_STORM}
        done = run_as_nobody(work, _NOBODY_SCRIPT, json.dumps(attacks))
        assert done.returncode == 0, done.stderr[-2000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        if not out['cases']:
            pytest.skip(f'no kernel level works for nobody here: {out["why_not"]}')
        for level, cases in out['cases'].items():
            for name, (_, stdout) in cases.items():
                assert 'PWNED' not in stdout, (level, name, stdout)
            assert int(cases['proc_sys'][1].split()[0]) == 0, level
            for name in ('fork', 'thread'):
                assert cases[name][1].strip(), (level, name, cases[name])
                assert 0 < int(cases[name][1].split()[0]) < 32, (level, name, cases[name])
    assert _kernel_settings() == settings


def test_the_paper_configs_refuse_the_unsafe_levels(monkeypatch):
    """Every paper config (configs/*_intern_s1_mini.py, *_qwen3_5_9b.py) requires
    'contained' or stronger: on a machine where only the audit-hook levels work,
    building its code reward is an error naming why."""
    from mmengine.config import Config

    import gepo_xtuner.reward.sandbox.trainer as sandbox_module
    from gepo_xtuner.registry import REWARDS
    from gepo_xtuner.reward.sandbox import SandboxError
    root = Path(__file__).parents[2]
    monkeypatch.setenv('GEPO_MODEL_PATH', '/models/any')
    monkeypatch.setenv('GEPO_DATA_DIR', '/data/any')
    paper = sorted([*root.glob('configs/*_intern_s1_mini.py'),
                    *root.glob('configs/*_qwen3_5_9b.py')])
    assert len(paper) >= 10
    for path in paper:
        code_cfg = Config.fromfile(path).train_cfg['rewards']['code']
        assert code_cfg['min_containment'] == 'contained', path
    monkeypatch.setattr(sandbox_module, 'available_levels', lambda python=None: {
        'isolated': 'no bwrap binary', 'contained': 'the kernel has no Landlock',
        'unsafe_files': None, 'unsafe': None})
    with pytest.raises(SandboxError, match="needs containment level 'contained'"):
        REWARDS.build(code_cfg)
