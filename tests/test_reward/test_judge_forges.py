"""Forges through the judge's reading of the tests, each with the right solution beside it.

* a standard-library module the tests use without importing it (MBPP's ``math.`` relying
  on the solution's ``import math``): the solution binding that name to its own object
  would run the tests' ``math.isclose`` in its process, answering True;
* ``StopIteration`` raised by a call ends the tests' ``map``/``filter`` quietly, so
  ``all(map(...))`` is True: it crosses as ``RuntimeError`` (PEP 479's rule);
* a value at the wire's bounds, wrapped by the tests and passed back, is over them: a
  failed run (score 0), not a reward error;
* a call-mode integer of 5,000 digits is refused whatever the process's int-conversion
  limit (``sys.set_int_max_str_digits(0)``), in linear time.
"""

import sys
import time

import pytest

from gepo_xtuner.reward import CodeReward
from gepo_xtuner.reward.base import RewardRouter
from gepo_xtuner.reward.sandbox import available_levels

WHY_NOT = available_levels()
LEVEL = next((lv for lv in ('isolated', 'contained') if WHY_NOT[lv] is None), None)
pytestmark = pytest.mark.skipif(LEVEL is None, reason=f'no kernel containment here: {WHY_NOT}')

FREE_MATH = {'domain': 'code', 'task_id': 'area', 'test_imports': [], 'test_list': [
    'assert math.isclose(area(10), 314.1592653589793, rel_tol=0.001)',
    'assert math.isclose(area(2), 12.566370614359172, rel_tol=0.001)']}
STOP = {'domain': 'code', 'task_id': 'twice', 'test_imports': [],
        'test_list': ['assert all(map(lambda x: f(x) == 2 * x, [1, 2, 3]))']}
NESTED = {'domain': 'code', 'task_id': 'nested', 'test_imports': [],
          'test_list': ['assert f(x=f(0)) == 1']}
NAMED_LIKE_A_MODULE = {'domain': 'code', 'task_id': 'copy', 'test_imports': [],
                       'test_list': ['assert copy([1, 2]) == [1, 2]']}
CALL = {'domain': 'code', 'id': 'add', 'tests': [{'fn_name': 'add', 'inputs': [[2, 3]],
                                                  'outputs': [5]}]}


def _scores(*pairs: tuple[str, dict]) -> tuple[list[float], dict[str, float]]:
    router = RewardRouter({'code': CodeReward(timeout_s=6, isolation=LEVEL)})
    values, metrics = router([f'```python\n{code}\n```' for code, _ in pairs],
                             [record for _, record in pairs])
    return values.tolist(), metrics


def test_the_tests_own_stdlib_module_is_not_the_solutions():
    right = 'import math\ndef area(r):\n    return math.pi * r * r\n'
    wrong = 'import math\ndef area(r):\n    return 3 * r * r\n'
    forge = ('class _M:\n    pi = 3.14159\n    def isclose(self, *a, **k):\n        return True\n'
             'math = _M()\ndef area(r):\n    return 3 * r * r\n')
    values, metrics = _scores((right, FREE_MATH), (wrong, FREE_MATH), (forge, FREE_MATH))
    assert values == [1.0, 0.0, 0.0] and metrics['reward/errors/code'] == 0.0


def test_a_solution_function_named_like_a_module_is_still_the_solutions():
    values, _ = _scores(('def copy(x):\n    return list(x)\n', NAMED_LIKE_A_MODULE),
                        ('def copy(x):\n    return []\n', NAMED_LIKE_A_MODULE))
    assert values == [1.0, 0.0]


def test_stop_iteration_from_a_call_does_not_end_the_tests_iteration():
    values, metrics = _scores(('def f(x):\n    return 2 * x\n', STOP),
                              ('def f(x):\n    raise StopIteration\n', STOP),
                              ('def f(x):\n    raise StopAsyncIteration\n', STOP))
    assert values == [1.0, 0.0, 0.0] and metrics['reward/errors/code'] == 0.0


def test_a_value_over_the_bounds_on_its_way_back_is_a_failed_run():
    deep = 'def f(x):\n    v = 0\n    for _ in range(100):\n        v = [v]\n    return v\n'
    values, metrics = _scores(('def f(x):\n    return 1\n', NESTED), (deep, NESTED))
    assert values == [1.0, 0.0] and metrics['reward/errors/code'] == 0.0


def test_huge_integers_are_refused_whatever_the_int_limit():
    control = ('import json, os, sys\nout = open(json.loads(sys.argv[1])["control_fd"], "wb", '
               'closefd=False, buffering=0)\nout.write(b\'{"value": \' + b"7" * 400000 + '
               'b"}\\n")\nos._exit(0)\n')
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # e.g. PYTHONINTMAXSTRDIGITS=0 in the trainer
    try:
        start = time.monotonic()
        values, metrics = _scores((control, CALL))
        seconds = time.monotonic() - start
    finally:
        sys.set_int_max_str_digits(before)
    assert values == [0.0] and metrics['reward/invalid_output/code'] == 1.0, metrics
    assert seconds < 6 + 2, seconds
