"""CodeReward and its sandbox: LiveCodeBench-style problems and hostile programs.

Every run is a real child process; the hostile programs (infinite loop, fork bomb,
memory hog, network access, output flood, killing the parent) must be contained,
score 0 within the time limit, and leave the test process unharmed with no process
left behind.
"""

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from gepo_xtuner.reward import CodeReward, RewardRouter
from gepo_xtuner.reward.code import extract_code, parse_tests
from gepo_xtuner.reward.sandbox import Sandbox, SandboxError, available_levels

HARNESS = str(Path(__file__).parents[2] / 'gepo_xtuner' / 'reward' / 'sandbox' / 'harness.py')
MODES = [level for level, why_not in available_levels().items() if why_not is None]

# LiveCodeBench-like stdin problem: maximum subarray sum.
MAX_SUBARRAY = {
    'domain': 'code', 'data_source': 'livecodebench',
    'prompt': 'Given N and N integers, print the maximum sum of a non-empty contiguous '
              'subarray. 1 <= N <= 2*10^5.',
    'tests': [{'input': '5\n-2 1 -3 4 -1\n', 'output': '4\n'},
              {'input': '1\n-7\n', 'output': '-7\n'},
              {'input': '6\n2 -1 2 3 -9 4\n', 'output': '6\n'}],
}
KADANE = """Here is an O(N) solution.
```python
import sys
def main():
    data = sys.stdin.read().split()
    n, xs = int(data[0]), list(map(int, data[1:]))
    best = cur = xs[0]
    for x in xs[1:]:
        cur = max(x, cur + x)
        best = max(best, cur)
    print(best)
main()
```"""
# Wrong on all-negative input (starts from 0).
KADANE_WRONG = KADANE.replace('best = cur = xs[0]', 'best = cur = 0').replace(
    'for x in xs[1:]', 'for x in xs')

# LeetCode/LiveCodeBench call-based problem.
TWO_SUM = {
    'domain': 'code',
    'tests': [{'fn_name': 'twoSum', 'inputs': [[[2, 7, 11, 15], 9], [[3, 2, 4], 6]],
               'outputs': [[0, 1], [1, 2]]}],
}
TWO_SUM_OK = """```python
class Solution:
    def twoSum(self, nums, target):
        seen = {}
        for i, x in enumerate(nums):
            if target - x in seen:
                return [seen[target - x], i]
            seen[x] = i
```"""
TWO_SUM_WRONG = TWO_SUM_OK.replace('[seen[target - x], i]', '[i, seen[target - x]]')


def _parent(pid: int) -> int:
    try:
        status = Path(f'/proc/{pid}/status').read_text()
    except OSError:
        return 0
    return int(status.split('\nPPid:', 1)[1].split()[0])


def _descends_from_this_process(pid: int) -> bool:
    me = os.getpid()
    while pid > 1:
        pid = _parent(pid)
        if pid == me:
            return True
    return False


def harness_processes() -> list[int]:
    """PIDs of live sandbox processes (their command line names the harness) that descend
    from this test process: the orphans of its runs are re-parented to it
    (tests/test_reward/conftest.py), the runs of other test processes are not counted."""
    pids = []
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                cmdline = Path(f'/proc/{entry}/cmdline').read_bytes()
            except OSError:
                continue
            if HARNESS.encode() in cmdline and _descends_from_this_process(int(entry)):
                pids.append(int(entry))
    return pids


@pytest.fixture(params=MODES)
def sandbox(request, tmp_path):
    yield Sandbox(timeout_s=1, memory_mb=256, max_output_bytes=64 << 10,
                  isolation=request.param, tmp_dir=str(tmp_path))
    assert harness_processes() == [], 'a sandboxed process survived its run'
    assert list(tmp_path.iterdir()) == [], 'a working directory was left behind'


def test_correct_and_wrong_stdin_solutions():
    reward = CodeReward(timeout_s=5)
    assert reward(KADANE, MAX_SUBARRAY) == 1.0
    assert reward(KADANE_WRONG, MAX_SUBARRAY) == 0.0  # fails the all-negative test
    assert CodeReward(partial_credit=True)(KADANE_WRONG, MAX_SUBARRAY) == pytest.approx(2 / 3)


def test_correct_and_wrong_call_based_solutions():
    reward = CodeReward(timeout_s=5)
    assert reward(TWO_SUM_OK, TWO_SUM) == 1.0
    assert reward(TWO_SUM_WRONG, TWO_SUM) == 0.0
    top_level = '```python\ndef twoSum(nums, target):\n    return [0, 1]\n```'
    assert CodeReward(partial_credit=True)(top_level, TWO_SUM) == 0.5


def test_livecodebench_functional_format_with_json_lines():
    record = {'metadata': {'func_name': 'maxProfit'}, 'tests': [
        {'input': '[7,1,5,3,6,4]', 'output': '5', 'testtype': 'functional'},
        {'input': '[7,6,4,3,1]', 'output': '0', 'testtype': 'functional'}]}
    code = ('```python\nclass Solution:\n    def maxProfit(self, prices):\n'
            '        low, best = prices[0], 0\n        for p in prices:\n'
            '            low = min(low, p)\n            best = max(best, p - low)\n'
            '        return best\n```')
    assert CodeReward(timeout_s=5)(code, record) == 1.0
    assert parse_tests(record)[0].args == [[7, 1, 5, 3, 6, 4]]


def test_parallel_workers_give_the_same_scores():
    reward = CodeReward(timeout_s=5, max_workers=3, partial_credit=True)
    assert reward(KADANE, MAX_SUBARRAY) == 1.0
    assert reward(KADANE_WRONG, MAX_SUBARRAY) == pytest.approx(2 / 3)
    assert CodeReward(timeout_s=5, max_workers=3)(KADANE_WRONG, MAX_SUBARRAY) == 0.0


def test_a_batch_scored_in_threads_equals_one_by_one():
    """``score_batch`` in 4 threads (the default; the RL loop scores a step's code responses
    so) gives each response the score and outcome of scoring one by one, in order:
    passes, partial failures, a time-out, an answer the trainer refuses to decode
    (``reward/invalid_output/code``), a response without code. A broken record in a batch
    costs only its own response (the router scores that batch again one by one)."""
    from .test_sandbox_fuzz import CALL_ATTACKS, CALL_RECORD
    batch = [(KADANE, MAX_SUBARRAY), (KADANE_WRONG, MAX_SUBARRAY), (TWO_SUM_OK, TWO_SUM),
             (TWO_SUM_WRONG, TWO_SUM), ('```python\nwhile True:\n    pass\n```', MAX_SUBARRAY),
             (f"```python\n{CALL_ATTACKS['malformed']}\n```", CALL_RECORD),
             ('no code here', TWO_SUM), (KADANE, MAX_SUBARRAY)]
    scored = {}
    for workers in (1, 4):
        reward = CodeReward(timeout_s=1, partial_credit=True, batch_workers=workers)
        direct = reward.score_batch([c for c, _ in batch], [r for _, r in batch])
        scored[workers] = ([float(v) for v in direct], [getattr(v, 'outcome', None)
                                                        for v in direct])
    assert scored[4] == scored[1]
    values, outcomes = scored[4]
    assert values == pytest.approx([1, 2 / 3, 1, 0, 0, 0, 0, 1])
    assert outcomes.count('invalid_output') == 1 and outcomes[5] == 'invalid_output'

    router = RewardRouter({'code': CodeReward(timeout_s=1, partial_credit=True)})
    values, metrics = router([c for c, _ in batch], [r for _, r in batch])
    assert values.tolist() == pytest.approx(scored[1][0])
    assert metrics['reward/errors/code'] == 0 and metrics['reward/invalid_output/code'] == 1
    broken = {'domain': 'code', 'tests': 'not a list'}
    values, metrics = router([c for c, _ in batch] + [KADANE],
                             [r for _, r in batch] + [broken])
    assert values.tolist() == pytest.approx(scored[1][0] + [0])
    assert metrics['reward/errors/code'] == 1 and metrics['reward/invalid_output/code'] == 1
    with pytest.raises(ValueError, match='batch_workers must be an integer >= 1'):
        CodeReward(batch_workers=0)


def test_floats_within_tolerance_and_output_normalisation():
    record = {'tests': [{'input': '', 'output': '0.333333333\n'}]}
    assert CodeReward()('print(1/3)', record) == 1.0  # 0.3333333333333333
    assert CodeReward(float_tol=None)('print(1/3)', record) == 0.0
    assert CodeReward()('print("0.33")', record) == 0.0


def test_infinite_loop_times_out_and_scores_zero(sandbox):
    start = time.monotonic()
    result = sandbox.run('while True:\n    pass\n')
    assert result.status == 'timeout'
    assert time.monotonic() - start < sandbox.timeout_s + 1.5


def test_fork_bomb_is_contained(sandbox):
    bomb = 'import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n'
    start = time.monotonic()
    result = sandbox.run(bomb)
    assert result.status in ('timeout', 'error')
    assert time.monotonic() - start < sandbox.timeout_s + 1.5
    # the fixture then checks that no process of the run is left


def test_memory_hog_fails_fast_without_touching_the_test_process(sandbox):
    # the limit it meets is memory: a time limit far from it, even on a busy machine
    sandbox.timeout_s = 10
    before = int(Path('/proc/self/statm').read_text().split()[1])
    result = sandbox.run('blocks = []\nwhile True:\n    blocks.append(bytearray(50 << 20))\n')
    assert result.status == 'error' and 'MemoryError' in result.stderr
    after = int(Path('/proc/self/statm').read_text().split()[1])
    assert (after - before) * os.sysconf('SC_PAGE_SIZE') < 50 << 20


def test_network_access_is_refused(sandbox):
    server = socket.create_server(('127.0.0.1', 0))
    server.settimeout(0.05)
    connections, done = [], threading.Event()

    def accept():
        while not done.is_set():
            try:
                connections.append(server.accept())
            except TimeoutError:
                pass
    thread = threading.Thread(target=accept)
    thread.start()
    port = server.getsockname()[1]
    code = (f'import socket\ns = socket.create_connection(("127.0.0.1", {port}), timeout=1)\n'
            's.sendall(b"leak")\nprint("connected")\n')
    try:
        result = sandbox.run(code)
    finally:
        done.set()
        thread.join()
        server.close()
    assert result.status == 'error' and 'connected' not in result.stdout
    assert connections == []


def test_output_flood_hits_the_output_limit(sandbox):
    result = sandbox.run('while True:\n    print("x" * 1000)\n')
    assert result.status == 'output_limit'
    assert len(result.stdout) <= sandbox.max_output_bytes


def test_the_code_cannot_signal_the_trainer_and_gets_no_secrets(sandbox, monkeypatch):
    monkeypatch.setenv('GEPO_TEST_SECRET', 'hunter2')
    result = sandbox.run('import os\nprint(os.environ.get("GEPO_TEST_SECRET"))\n'
                         'os.kill(os.getppid(), 9)\n')
    assert result.stdout == 'None\n' and result.status == 'error'
    assert os.getpid() > 0  # still alive


def test_code_runs_in_a_fresh_directory_with_stdin(sandbox):
    result = sandbox.run('import os\nprint(os.listdir("."), input())\nopen("f", "w").write("x")',
                         stdin='hello\n')
    assert result.stdout == "[] hello\n"


# levels whose PID namespace is the kernel's
PID_NS_MODES = [m for m in ('isolated', 'contained') if m in MODES and 'unsafe_files' in MODES
                or m == 'isolated' and m in MODES]


@pytest.mark.skipif(not PID_NS_MODES, reason='no PID namespaces here')
@pytest.mark.parametrize('level', PID_NS_MODES)
def test_pid_namespace_kills_processes_that_left_the_session(tmp_path, level):
    """A daemonised grandchild (setsid + exec) escapes a process-group kill; the PID
    namespace (and, as root, the run's own uid) still ends it."""
    marker = '61.37'
    code = ('import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n'
            f'        os.execv("/bin/sleep", ["sleep", "{marker}"])\n    os._exit(0)\n'
            'time.sleep(0.3)\nprint("spawned")\n')
    result = Sandbox(timeout_s=2, isolation=level, tmp_dir=str(tmp_path)).run(code)
    assert result.stdout == 'spawned\n'
    time.sleep(0.2)
    leftovers = [pid for pid in os.listdir('/proc') if pid.isdigit()
                 and marker.encode() in _cmdline(pid)]
    assert leftovers == []


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f'/proc/{pid}/cmdline').read_bytes()
    except OSError:
        return b''


def test_process_limit_holds_as_root_and_not():
    """RLIMIT_NPROC holds because the code never runs as root (a root trainer gives it
    a uid of its own), not because an audit hook refuses fork."""
    box = Sandbox(timeout_s=2, max_processes=8, isolation=MODES[0])
    code = ('import os, time\nn = 0\nfor _ in range(50):\n    try:\n        if os.fork() == 0:\n'
            '            time.sleep(5)\n            os._exit(0)\n        n += 1\n'
            '    except OSError:\n        break\nprint(n)\n')
    result = box.run(code)
    assert result.status != 'ok' or int(result.stdout) < 8


def test_timeout_is_a_score_but_a_broken_sandbox_is_an_error():
    router = RewardRouter(dict(code=CodeReward(timeout_s=1)))
    broken = CodeReward(timeout_s=1)
    broken.sandbox.python = '/nonexistent/python'
    rewards, metrics = router(['while True: pass', KADANE],
                              [dict(MAX_SUBARRAY, id='tle'), MAX_SUBARRAY])
    assert rewards.tolist() == [0.0, 1.0] and metrics['reward/errors/code'] == 0.0
    with pytest.raises(SandboxError, match='sandbox'):
        broken(KADANE, MAX_SUBARRAY)
    rewards, metrics = RewardRouter(dict(code=broken))([KADANE], [MAX_SUBARRAY])
    assert rewards.tolist() == [0.0] and metrics['reward/errors/code'] == 1.0


def test_extract_code_prefers_the_last_python_block():
    text = ('Plan:\n```\nnot code\n```\n```python\nprint(1)\n```\nFinal:\n```python\n'
            'print(2)\n```\nDone.')
    assert extract_code(text) == 'print(2)\n'
    assert extract_code('```python\nprint(3)\n') == 'print(3)\n'  # cut off by max tokens
    assert extract_code('```\nprint(4)\n```') == 'print(4)\n'
    assert CodeReward()('I do not know.', MAX_SUBARRAY) == 0.0


def test_bad_tests_raise_clear_errors():
    with pytest.raises(ValueError, match="has no 'tests'"):
        parse_tests({'id': 'p1'})
    with pytest.raises(ValueError, match=r'tests\[0\]: expected \{"input", "output"\}'):
        parse_tests({'tests': [{'stdin': '1'}]})
    with pytest.raises(ValueError, match='equal length'):
        parse_tests({'tests': [{'fn_name': 'f', 'inputs': [[1]], 'outputs': []}]})
