"""Solution output never raises out of the reward, and never costs unbounded time.

Everything that comes back from a sandbox is the solution's to shape: the answers of call
mode (the solution shares the harness's process and can write to the control channel), the
values on the pipe of an assert run (the solution's process can write raw bytes to it),
what it prints. Deep, huge, colliding, malformed, non-UTF-8, early and duplicated answers
on both channels score 0, are not counted as reward errors, and each record ends within
its timeout plus :data:`BOUND_S` (measured: docs/rewards.md, "Cost").
"""

import random
import sys
import time

import pytest

from gepo_xtuner.reward import CodeReward
from gepo_xtuner.reward.base import RewardRouter
from gepo_xtuner.reward.code import _same_token, same_stdout, same_value
from gepo_xtuner.reward.sandbox import available_levels
from gepo_xtuner.reward.sandbox.wire import (_MAX_DEPTH, MAX_EQUAL_HASHES, _decode, _encode,
                                             decode_value, encode_value)

WHY_NOT = available_levels()
SAFE_LEVELS = [level for level in ('isolated', 'contained') if WHY_NOT[level] is None]

#: Seconds a record may take beyond its timeout. Measured on the project's 2-core AMD EPYC
#: (load 2-5): every record below ended within 0.97 s in all (the slowest: a 6 MB answer
#: parsed and refused in the trainer), and a record that ran into its timeout ended 0.02 s
#: after it; 2 s leaves room for a loaded machine (docs/rewards.md, "Cost").
BOUND_S = 2.0
TIMEOUT_S = 4.0
if getattr(sys.modules.get('coverage'), 'Coverage', None) is not None and \
        sys.modules['coverage'].Coverage.current() is not None:
    # under `make coverage` the trainer's side (decoding a 6 MB answer) runs traced: 6.1 s
    # for huge_line on that machine; the bound is about runs that never end, not speed
    BOUND_S *= 3
# ints of one hash, as a list (building the set in the sandbox would itself be quadratic)
COLLIDING = 'M = (1 << 61) - 1\nvalues = [k * M for k in range(24000)]\n'


# ------------------------------------------------------------- decoding, in the trainer

def _nested(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


def test_encode_and_decode_agree_on_depth():
    """Depth 100 crosses both ways; depth 101 is refused by both (they used to differ by
    one: the decoder took 101)."""
    ok, deep = _nested(_MAX_DEPTH), _nested(_MAX_DEPTH + 1)
    assert decode_value(encode_value(ok)) == ok
    assert _decode(_encode(ok, None)) == ok
    with pytest.raises(ValueError):
        encode_value(deep)
    with pytest.raises(ValueError):
        _encode(deep, None)
    with pytest.raises(ValueError):
        decode_value(deep)
    tagged = 0
    for _ in range(_MAX_DEPTH + 1):
        tagged = {'__tuple__': [tagged]}
    with pytest.raises(ValueError):
        decode_value(tagged)


def test_colliding_keys_are_refused_in_linear_time():
    """A set of 24,000 ints of one hash took 18 s to build; now refused at once, as a
    dict of them; a set with a few equal hashes (-1 and -2) still decodes."""
    m = (1 << 61) - 1
    for data in ({'__set__': [k * m for k in range(24000)]},
                 {'__frozenset__': [k * m for k in range(24000)]},
                 {'__dict__': [[k * m, 0] for k in range(24000)]},
                 {'__set__': [{'__tuple__': [k * m]} for k in range(24000)]}):
        start = time.monotonic()
        with pytest.raises(ValueError, match='share a hash'):
            decode_value(data)
        assert time.monotonic() - start < 1.0
    assert decode_value({'__set__': [-1, -2, *range(1000)]}) == {-1, -2, *range(1000)}
    assert len(decode_value({'__set__': [k * m for k in range(MAX_EQUAL_HASHES)]})) == \
        MAX_EQUAL_HASHES


def test_malformed_values_raise_only_value_error():
    """Random malformed shapes (bad tags, bodies of the wrong type, unhashable keys, too
    many items) raise ValueError and nothing else."""
    rng = random.Random(0)
    atoms = [None, True, 1, 1.5, 'x', [], {}, [1, [2]], {'a': 1, 'b': 2}, 10 ** 50]
    tags = ['__tuple__', '__set__', '__frozenset__', '__dict__', '__bytes__', '__complex__',
            '__ref__', '__nope__']

    def shape(depth: int) -> object:
        if depth > 3 or rng.random() < 0.3:
            return rng.choice(atoms)
        if rng.random() < 0.5:
            return [shape(depth + 1) for _ in range(rng.randrange(3))]
        return {rng.choice(tags): rng.choice([shape(depth + 1), 'zz', [[1]], [[[], 1]],
                                              [1.0, 'x'], 5])}
    for _ in range(3000):
        data = shape(0)
        try:
            decode_value(data)
        except ValueError:
            pass
    with pytest.raises(ValueError):
        decode_value([0] * ((1 << 20) + 1))


def test_comparisons_of_solution_output_never_raise():
    """An int beyond any float where a float is expected, and 5,000-digit tokens where an
    integer is expected: a comparison, not an exception."""
    assert same_value(10 ** 400, 1.5) is False
    assert same_value(-10 ** 400, float('-inf')) is False
    assert same_value(10 ** 400, [1.5]) is False
    big = '1' * 5000
    assert _same_token(big, big + '0', 1e-6) is False
    assert _same_token('+000' + big, big, 1e-6) is True
    assert _same_token('-0', '0', None) is True
    assert same_stdout(big + '\n', big[:-1] + '2') is False
    assert same_stdout('9' * 100000, '1.5') is False


# ----------------------------------------------------------- the channels, end to end

#: call mode: what the solution writes on the control channel (``CONTROL`` is its file)
CONTROL = ('import json, sys\nCONTROL = open(json.loads(sys.argv[1])["control_fd"], "wb", '
           'closefd=False, buffering=0)\n')
CALL_ATTACKS = {
    'deep_json': CONTROL + 'CONTROL.write(b"[" * 100000 + b"\\n")\nimport os\nos._exit(0)\n',
    'deep_value_line': CONTROL + ('CONTROL.write(b\'{"value": \' + b"[" * 100000 + b"0" + '
                                  'b"]" * 100000 + b"}\\n")\nimport os\nos._exit(0)\n'),
    'huge_line': CONTROL + ('CONTROL.write(b\'{"value": [\' + b"1," * 3000000 + b\'1]}\\n\')\n'
                            'import os\nos._exit(0)\n'),
    'colliding_set': CONTROL + COLLIDING + (
        'CONTROL.write(("{\\"value\\": {\\"__set__\\": " + json.dumps(values) + '
        '"}}\\n").encode())\nimport os\nos._exit(0)\n'),
    'colliding_dict_line': CONTROL + COLLIDING + (
        'CONTROL.write(("{\\"value\\": {\\"__dict__\\": " + json.dumps([[v, 0] for v in '
        'values]) + "}}\\n").encode())\nimport os\nos._exit(0)\n'),
    'digits': CONTROL + ('CONTROL.write(b\'{"value": \' + b"7" * 5000 + b"}\\n")\n'
                         'import os\nos._exit(0)\n'),
    'malformed': CONTROL + 'CONTROL.write(b\'{"value": \\n{"valu\\n\')\nimport os\nos._exit(0)\n',
    'non_utf8': CONTROL + 'CONTROL.write(b\'{"value": "\\xff\\xfe"}\\n\')\nimport os\nos._exit(0)\n',
    'early': CONTROL + 'CONTROL.write(b\'{"value": 5}\\n\')\ndef add(a, b):\n    return a + b\n',
    'duplicated': CONTROL + ('def add(a, b):\n    CONTROL.write(b\'{"value": 5}\\n\')\n'
                             '    return a + b\n'),
    'extra_keys': CONTROL + ('CONTROL.write(b\'{"value": 5, "more": 1}\\n\')\n'
                             'import os\nos._exit(0)\n'),
    'tags': CONTROL + ('CONTROL.write(b\'{"value": {"__complex__": [1, "x"]}}\\n\')\n'
                       'import os\nos._exit(0)\n'),
    'overflow_float': 'def add(a, b):\n    return 10 ** 400\n',
}
#: assert mode: what the solution's process writes on the pipe to the judge
PIPE = ('import gc, os\nPIPE = [o for o in gc.get_objects() '
        'if type(o).__name__ == "Channel"][0]._out\n'
        'def send(data):\n    while data:\n        data = data[os.write(PIPE, data):]\n')
ASSERT_ATTACKS = {
    'deep_json': PIPE + 'def add(a, b):\n    send(b"[" * 100000 + b"\\n")\n    os._exit(0)\n',
    'deep_value': PIPE + ('def add(a, b):\n    send(b\'{"value": \' + b"[" * 100000 + b"0" '
                          '+ b"]" * 100000 + b"}\\n")\n    os._exit(0)\n'),
    'huge': PIPE + ('def add(a, b):\n    send(b\'{"value": [\' + b"1," * 3000000 + '
                    'b\'1]}\\n\')\n    os._exit(0)\n'),
    'colliding_set': PIPE + COLLIDING + (
        'import json\ndef add(a, b):\n    send(("{\\"value\\": {\\"__set__\\": " + '
        'json.dumps(values) + "}}\\n").encode())\n    os._exit(0)\n'),
    'malformed': PIPE + 'def add(a, b):\n    send(b\'{"value": \\n\')\n    os._exit(0)\n',
    'non_utf8': PIPE + 'def add(a, b):\n    send(b\'{"value": "\\xff"}\\n\')\n    os._exit(0)\n',
    'early': PIPE + 'send(b\'{"value": 5}\\n\')\ndef add(a, b):\n    return a + b + 1\n',
    'duplicated': PIPE + ('def add(a, b):\n    send(b\'{"value": 5}\\n{"value": 5}\\n\')\n'
                          '    os._exit(0)\n'),
    'forged_modules': PIPE + ('def add(a, b):\n    return 0\n'
                              'send(b\'{"value": {"__dict__": []}, "modules": '
                              '{"add": "yapf"}}\\n\')\n'),
    'digits': PIPE + ('def add(a, b):\n    send(b\'{"value": \' + b"7" * 5000 + b"}\\n")\n'
                      '    os._exit(0)\n'),
}
#: answers the trainer refuses to decode: counted in ``reward/invalid_output/<domain>``
INVALID_CALL_OUTPUT = ('deep_json', 'deep_value_line', 'huge_line', 'colliding_set',
                       'colliding_dict_line', 'malformed', 'duplicated')
CALL_RECORD = {'domain': 'code', 'id': 'add-call',
               'tests': [{'fn_name': 'add', 'inputs': [[2, 3]], 'outputs': [5]}]}
FLOAT_RECORD = {'domain': 'code', 'id': 'add-float',
                'tests': [{'fn_name': 'add', 'inputs': [[2, 3]], 'outputs': [5.5]}]}
MBPP_LITERAL = {'domain': 'code', 'task_id': 'add-literal', 'test_list': ['assert add(2, 3) == 5']}
ASSERT_RECORD = {'domain': 'code', 'task_id': 'add-assert',
                 'test_list': ['assert add(2, 3) == 5', 'assert set([add(1, 1)]) == {2}']}


def _score(level: str, code: str, record: dict) -> tuple[float, float, float]:
    """(reward, reward errors counted, wall seconds) of one record through the router."""
    return _score_counted(level, code, record)[:3]


def _score_counted(level: str, code: str, record: dict) -> tuple[float, float, float, float]:
    """(reward, reward errors, wall seconds, ``reward/invalid_output/code``) of one record."""
    reward = CodeReward(timeout_s=TIMEOUT_S, isolation=level)
    router = RewardRouter({'code': reward})
    start = time.monotonic()
    values, metrics = router([f'```python\n{code}\n```'], [record])
    return (float(values[0]), metrics['reward/errors/code'], time.monotonic() - start,
            metrics['reward/invalid_output/code'])


@pytest.mark.skipif(not SAFE_LEVELS, reason=f'no kernel containment here: {WHY_NOT}')
@pytest.mark.parametrize('attack', list(CALL_ATTACKS))
def test_call_channel_fuzz_scores_zero_without_errors(attack):
    level = SAFE_LEVELS[0]
    for record in (CALL_RECORD, FLOAT_RECORD, MBPP_LITERAL):
        score, errors, wall, invalid = _score_counted(level, CALL_ATTACKS[attack], record)
        assert (score, errors) == (0.0, 0.0), (attack, record['id'] if 'id' in record
                                               else record['task_id'])
        assert wall < TIMEOUT_S + BOUND_S, (attack, wall)
        if record is CALL_RECORD and attack in INVALID_CALL_OUTPUT:
            assert invalid == 1.0, (attack, 'not counted in reward/invalid_output/code')


@pytest.mark.skipif(not SAFE_LEVELS, reason=f'no kernel containment here: {WHY_NOT}')
@pytest.mark.parametrize('attack', list(ASSERT_ATTACKS))
def test_assert_channel_fuzz_scores_zero_without_errors(attack):
    level = SAFE_LEVELS[0]
    score, errors, wall = _score(level, ASSERT_ATTACKS[attack], ASSERT_RECORD)
    assert (score, errors) == (0.0, 0.0), attack
    assert wall < TIMEOUT_S + BOUND_S, (attack, wall)


@pytest.mark.skipif(not SAFE_LEVELS, reason=f'no kernel containment here: {WHY_NOT}')
def test_the_fuzz_harness_can_pass():
    """The records and the router score a right answer 1 (so a 0 above is the attack's)."""
    right = 'def add(a, b):\n    return a + b\n'
    for record in (CALL_RECORD, MBPP_LITERAL, ASSERT_RECORD):
        assert _score_counted(SAFE_LEVELS[0], right, record)[:2] == (1.0, 0.0)
        assert _score_counted(SAFE_LEVELS[0], right, record)[3] == 0.0
    assert _score(SAFE_LEVELS[0], 'def add(a, b):\n    return 5.5\n', FLOAT_RECORD)[:2] == \
        (1.0, 0.0)
