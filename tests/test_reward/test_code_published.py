"""CodeReward on published code benchmarks as published, and comparisons that cannot be gamed.

MBPP (original and sanitized splits) and HumanEval records below are written in each
dataset's exact schema (the data cannot be downloaded here). Each is scored as it is: the
record's own reference solution scores 1, a wrong one 0, and every hack a policy learns
(exiting early, raising ``SystemExit``, objects that equal anything, patching builtins,
forging the harness's report) scores 0 (tests/test_reward/test_reward_hacking.py runs every
hack against every form). Real sandbox runs throughout.
"""

import pytest

from gepo_xtuner.reward import CodeReward
from gepo_xtuner.reward.code import parse_tests, same_stdout, same_value

from .hacks import ALWAYS_EQUAL

# MBPP, original split (task_id, text, code, test_list, test_setup_code, challenge_test_list)
MBPP_11 = {
    'task_id': 11,
    'text': 'Write a python function to remove first and last occurrence of a given character '
            'from the string.',
    'code': 'def remove_Occ(s,ch): \r\n    for i in range(len(s)): \r\n        if (s[i] == ch): '
            '\r\n            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    for i in '
            'range(len(s) - 1,-1,-1):  \r\n        if (s[i] == ch): \r\n            s = s[0 : i] '
            '+ s[i + 1:] \r\n            break\r\n    return s ',
    'test_list': ['assert remove_Occ("hello","l") == "heo"',
                  'assert remove_Occ("abcda","a") == "bcd"',
                  'assert remove_Occ("PHP","P") == "H"'],
    'test_setup_code': '',
    'challenge_test_list': ['assert remove_Occ("hellolloll","l") == "helollol"',
                            'assert remove_Occ("","l") == ""'],
}
# replace() removes every occurrence: right on test_list, wrong on the challenge tests
MBPP_11_REPLACE = 'def remove_Occ(s, ch):\n    return s.replace(ch, "")\n'
# MBPP, sanitized split (source_file, task_id, prompt, code, test_imports, test_list)
MBPP_2_SANITIZED = {
    'source_file': 'Benchmark Questions Verification V2.ipynb', 'task_id': 2,
    'prompt': 'Write a function to find the shared elements from the given two lists.',
    'code': 'def similar_elements(test_tup1, test_tup2):\n  res = tuple(set(test_tup1) & '
            'set(test_tup2))\n  return (res) ',
    'test_imports': [],
    'test_list': ['assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))',
                  'assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))',
                  'assert set(similar_elements((11, 12, 14, 13),(17, 15, 14, 13))) == '
                  'set((13, 14))'],
}
MBPP_MATH = {  # an assert with a module the tests import (sanitized split style)
    'task_id': 'math-1', 'prompt': 'Write a function for the area of a circle of radius r.',
    'code': 'import math\ndef area(r):\n    return math.pi * r * r\n',
    'test_imports': ['import math'],
    'test_list': ['assert math.isclose(area(10), 314.1592653589793, rel_tol=0.001)',
                  'assert math.isclose(area(2), 12.566370614359172, rel_tol=0.001)'],
}
# HumanEval (task_id, prompt, canonical_solution, test, entry_point)
HUMANEVAL_2 = {
    'task_id': 'HumanEval/2',
    'prompt': '\n\ndef truncate_number(number: float) -> float:\n    """ Given a positive floating '
              'point number, it can be decomposed into\n    and integer part (the largest '
              'integer smaller than given number) and decimals\n    (leftover part always '
              'smaller than 1).\n\n    Return the decimal part of the number.\n    >>> '
              'truncate_number(3.5)\n    0.5\n    """\n',
    'canonical_solution': '    return number % 1.0\n',
    'test': "\n\nMETADATA = {\n    'author': 'jt',\n    'dataset': 'test'\n}\n\n\ndef "
            'check(candidate):\n    assert candidate(3.5) == 0.5\n    assert abs(candidate(1.33) '
            '- 0.33) < 1e-6\n    assert abs(candidate(123.456) - 0.456) < 1e-6\n',
    'entry_point': 'truncate_number',
}
HUMANEVAL_0 = {
    'task_id': 'HumanEval/0',
    'prompt': 'from typing import List\n\n\ndef has_close_elements(numbers: List[float], '
              'threshold: float) -> bool:\n    """ Check if in given list of numbers, are any two '
              'numbers closer to each other than\n    given threshold.\n    >>> '
              'has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n    >>> '
              'has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)\n    True\n    """\n',
    'canonical_solution': '    for idx, elem in enumerate(numbers):\n        for idx2, elem2 in '
                          'enumerate(numbers):\n            if idx != idx2:\n                '
                          'distance = abs(elem - elem2)\n                if distance < '
                          'threshold:\n                    return True\n\n    return False\n',
    'test': "\n\nMETADATA = {\n    'author': 'jt',\n    'dataset': 'test'\n}\n\n\ndef "
            'check(candidate):\n    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True\n'
            '    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False\n    assert '
            'candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True\n    assert candidate([1.0, 2.0, '
            '5.9, 4.0, 5.0], 0.8) == False\n    assert candidate([1.0, 2.0, 3.0, 4.0, 5.0, 2.0], '
            '0.1) == True\n    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 1.0) == True\n    '
            'assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 0.5) == False\n\n',
    'entry_point': 'has_close_elements',
}


def fenced(code: str) -> str:
    return f'Here is my solution.\n```python\n{code}\n```'


@pytest.fixture(scope='module')
def reward():
    return CodeReward(timeout_s=5)


def test_mbpp_as_published(reward):
    assert parse_tests(MBPP_11)[0].kind == 'call'  # literal asserts: expected values stay out
    assert reward(fenced(MBPP_11['code']), MBPP_11) == 1.0
    assert reward(fenced(MBPP_11_REPLACE), MBPP_11) == 1.0  # passes what MBPP tests
    strict = CodeReward(timeout_s=5, challenge_tests=True)
    assert strict(fenced(MBPP_11['code']), MBPP_11) == 1.0
    assert strict(fenced(MBPP_11_REPLACE), MBPP_11) == 0.0
    assert reward(fenced('def remove_Occ(s, ch):\n    return s\n'), MBPP_11) == 0.0


def test_mbpp_sanitized_and_non_literal_asserts(reward):
    assert parse_tests(MBPP_2_SANITIZED)[0].kind == 'asserts'
    assert reward(fenced(MBPP_2_SANITIZED['code']), MBPP_2_SANITIZED) == 1.0
    assert reward(fenced('def similar_elements(a, b):\n    return tuple(set(a) | set(b))\n'),
                  MBPP_2_SANITIZED) == 0.0
    assert reward(fenced(MBPP_MATH['code']), MBPP_MATH) == 1.0
    assert reward(fenced('def area(r):\n    return 3 * r * r\n'), MBPP_MATH) == 0.0


def test_humaneval_as_published(reward):
    for record in (HUMANEVAL_0, HUMANEVAL_2):
        full = record['prompt'] + record['canonical_solution']
        assert reward(fenced(full), record) == 1.0
        # HumanEval's own convention: the completion continues the prompt (body only)
        assert reward(record['canonical_solution'], record) == 1.0
    assert reward('    return number - int(number) + 0.1\n', HUMANEVAL_2) == 0.0
    assert reward('    return False\n', HUMANEVAL_0) == 0.0


def test_published_records_with_bad_fields_say_what_to_fix():
    with pytest.raises(ValueError, match=r"\(MBPP\): 'test_list' must be a non-empty list"):
        parse_tests({'task_id': 3, 'test_list': 'assert f(1) == 2'})
    with pytest.raises(ValueError, match=r'\(MBPP\): the tests do not parse'):
        parse_tests({'task_id': 3, 'test_list': ['assert f(1) ==']})
    with pytest.raises(ValueError, match=r"\(HumanEval\): 'test' must define check"):
        parse_tests({'task_id': 'HumanEval/9', 'test': 'assert 1', 'entry_point': 'f'})
    assert CodeReward().check_record({'task_id': 4, 'text': 'x'})[0].endswith(
        "no 'test' + 'entry_point' (HumanEval)")


# --------------------------------------------------------------- comparison rules

@pytest.mark.parametrize('printed, expected', [
    ('5.0000000015e+19', '50000000015000000001'),   # n*(n+1)/2 in floats
    ('1000000.0', '1000001'),
    ('1e12', '999999999999'),
    ('5.0', '5'),
    ('7e0', '7'),
    ('0x10', '16'),
    ('nan', '3'),
])
def test_an_integer_matches_only_the_same_integer(printed, expected):
    assert not same_stdout(printed + '\n', expected + '\n')
    record = {'tests': [{'input': '', 'output': expected + '\n'}]}
    assert CodeReward(timeout_s=5)(fenced(f'print({printed!r})'), record) == 0.0


@pytest.mark.parametrize('printed, expected', [
    ('0.3333333', '0.333333333'), ('5', '5.0'), ('1e-7', '0.0'), ('+7', '7'), ('007', '7'),
    ('2.50000000001', '2.5'), ('inf', 'inf')])
def test_a_float_reference_is_compared_with_tolerance(printed, expected):
    assert same_stdout(printed, expected)


@pytest.mark.parametrize('returned, expected, tuple_as_list', [
    ('5', '"5"', False),          # LiveCodeBench: the output "\"5\"" is the string 5
    ('"5"', '5', False),
    ('5.0', '5', False),
    ('True', '1', False),
    ('(0, 1)', '[0, 1]', False),
    ('{1: 2}', '{"1": 2}', False),
    ('[0, 1.5]', '[0, 2]', False),
    ('None', '0', False),
])
def test_typed_return_values(returned, expected, tuple_as_list):
    record = {'metadata': {'func_name': 'f'},
              'tests': [{'input': '1', 'output': expected, 'testtype': 'functional'}]}
    code = fenced(f'def f(x):\n    return {returned}\n')
    reward = CodeReward(timeout_s=5, tuple_as_list=tuple_as_list)
    assert reward(code, record) == 0.0


def test_typed_return_values_that_match():
    assert same_value((0, 1), [0, 1], tuple_as_list=True)
    assert same_value({'a': [1, 2.0000000001]}, {'a': [1, 2.0]})
    record = {'metadata': {'func_name': 'f'},
              'tests': [{'input': '1', 'output': '[1, "a", 2.5, null, true]',
                         'testtype': 'functional'}]}
    reward = CodeReward(timeout_s=5)
    assert reward(fenced('def f(x):\n    return [x, "a", 2.5, None, True]\n'), record) == 1.0
    assert reward(fenced('def f(x):\n    return (x, "a", 2.5, None, True)\n'), record) == 0.0
    assert CodeReward(timeout_s=5, tuple_as_list=True)(
        fenced('def f(x):\n    return (x, "a", 2.5, None, True)\n'), record) == 1.0
    assert reward(fenced(ALWAYS_EQUAL + 'def f(x):\n    return Anything()\n'), record) == 0.0
