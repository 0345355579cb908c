"""The judge runs nothing the solution can shape.

The test process of an assert run (the judge) holds the nonce and the report channel, so
anything that runs in it can forge a pass. Two things could have let the solution choose
what runs there: a module it names (the judge imported any module the solution's names
were bound to) and a file it wrote (the judge's HOME and TMPDIR were the solution's
folder, where libraries look for caches, config and start-up hooks). Together they forged
a pass on every assert form (:func:`~tests.test_reward.hacks.planted_cache`).

These tests check the class, not that instance: the judge's file opens and imports are
traced (audit events recorded in the judge, :attr:`Sandbox.trace_judge`) for a run whose
solution fills every folder it can write with bait, and nothing may come from there; and
they show that the trace catches both ways back in, by running patched copies of the
sandbox (its HOME pointed back at the solution's folder; the module check removed).
Real sandbox runs, as root and as the user nobody.
"""

import json
import os
import subprocess
import sys
import tempfile
from importlib.metadata import packages_distributions

import pytest

from gepo_xtuner.reward import CodeReward
from gepo_xtuner.reward.sandbox import available_levels

from .hacks import planted_cache
from .nobody import nobody_skip_reason, run_as_nobody, sandbox_copy
from .test_code_published import MBPP_2_SANITIZED
from .test_reward_hacking import HUMANEVAL

WHY_NOT = available_levels()
SAFE_LEVELS = [level for level in ('isolated', 'contained') if WHY_NOT[level] is None]
pytestmark = pytest.mark.skipif(not SAFE_LEVELS, reason=f'no kernel containment here: {WHY_NOT}')

# MBPP, original split, with test_setup_code (the setup runs in the judge, before the asserts)
MBPP_SETUP = {
    'task_id': 'setup-1', 'text': 'Write a function that adds two numbers.',
    'code': 'def add(a, b):\n    return a + b\n',
    'test_setup_code': 'import math\nBASE = int(math.sqrt(4))',
    'test_list': ['assert add(BASE, 3) == 5', 'assert add(-BASE, 1) == -1'],
    'challenge_test_list': [],
}
#: every assert form the chain forged a pass on: (record, the name its tests call)
CHAIN_FORMS = {
    'humaneval_0': (HUMANEVAL['HumanEval/0'], 'has_close_elements'),
    'humaneval_32': (HUMANEVAL['HumanEval/32'], 'find_zero'),
    'mbpp_sanitized_2': (MBPP_2_SANITIZED, 'similar_elements'),
    'mbpp_test_setup_code': (MBPP_SETUP, 'add'),
}


# ------------------------------------------------------------------ the chain, as found

@pytest.mark.parametrize('level', SAFE_LEVELS)
@pytest.mark.parametrize('form', list(CHAIN_FORMS))
def test_the_planted_cache_chain_scores_zero(form, level):
    """Module name from the solution + pickle in a cache under its HOME + a dependency of
    mmengine that loads it at import: 0 on every assert form (it forged 1.0 before)."""
    record, name = CHAIN_FORMS[form]
    reward = CodeReward(timeout_s=10, isolation=level)
    assert reward(f'```python\n{planted_cache(name)}\n```', record) == 0.0
    # and the same with tests that import yapf themselves (allowed): the judge's HOME is
    # its own, so the import finds no pickle
    tests = f'import yapf\nassert {name}(1) == 2\n'
    box = reward.sandbox
    box.trace_judge = True
    result = box.run(planted_cache(name), asserts=tests)
    assert not result.has_value, result
    assert 'yapf' in result.judge_trace['modules']


_NOBODY_CHAIN = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
from boxpkg.sandbox import AssertTests, Sandbox, available_levels
jobs = json.load(open(sys.argv[2]))
why_not = available_levels()
out = {}
for level in ('isolated', 'contained'):
    if why_not[level] is not None:
        continue
    box = Sandbox(timeout_s=15, isolation=level)
    box.trace_judge = True
    out[level] = []
    for code, tests in jobs:
        r = box.run(code, asserts=AssertTests(**tests))
        out[level].append([r.status, r.has_value, r.stderr[-2000:], r.judge_trace,
                           r.stdout[-2000:]])
print('RESULT ' + json.dumps(out))
'''


def _as_nobody(jobs: list[tuple[str, dict]]) -> dict:
    """Runs ``(code, AssertTests fields)`` jobs in a sandbox whose trainer is nobody."""
    with sandbox_copy() as work:
        (work / 'jobs.json').write_text(json.dumps(jobs))
        done = run_as_nobody(work, _NOBODY_CHAIN, str(work / 'jobs.json'), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = [x for x in done.stdout.splitlines() if x.startswith('RESULT ')][-1]
    out = json.loads(line[len('RESULT '):])
    if not out:
        pytest.skip('no kernel level works for nobody here')
    return out


def _assert_tests(record: dict, name: str, code: str) -> tuple[str, dict]:
    """The sandbox request CodeReward makes for ``code`` against ``record``."""
    from gepo_xtuner.reward.code import parse_tests
    case, = parse_tests(record)
    if case.entry_point and f'def {case.entry_point}(' not in code:
        code = case.prelude + code
    fields = dict(program=case.asserts, prelude=case.prelude, entry_point=case.entry_point,
                  names=list(case.names))
    return code, fields


@pytest.mark.skipif(nobody_skip_reason() is not None, reason=str(nobody_skip_reason()))
def test_the_planted_cache_chain_scores_zero_as_nobody():
    """The chain against a trainer running as nobody (both processes share its uid, so
    the solution could make its files readable to the judge): no pass on any form, and
    the reference solutions still pass (the runs are real)."""
    jobs = []
    for record, name in CHAIN_FORMS.values():
        ref = (record['prompt'] + record['canonical_solution'] if 'canonical_solution' in record
               else record['code'])
        jobs += [_assert_tests(record, name, planted_cache(name)),
                 _assert_tests(record, name, ref)]
    for level, results in _as_nobody(jobs).items():
        verdicts = [row[1] for row in results]
        assert verdicts == [False, True] * len(CHAIN_FORMS), (level, [
            (row[0], row[2][-300:]) for row in results])


# --------------------------------------------------- the class: what the judge reads

def _installed_names() -> list[str]:
    """Top-level import names of every installed distribution, and the distributions'
    names: the folders a library may keep under ``~/.cache``, ``~/.config``, ..."""
    names = set()
    for module, dists in packages_distributions().items():
        names.add(module)
        names.update(dists)
    return sorted(n for n in names if n.replace('-', '_').replace('.', '_').isidentifier())


#: A solution that fills every folder it can write with bait, then answers correctly:
#: a pickle, a ``.pth`` file, ``sitecustomize``/``usercustomize`` and a module named like
#: each of the test program's imports, in the user cache, config and data folders of
#: every installed package, the user site of this Python, HOME, /tmp and /dev/shm; and
#: yapf's grammar cache and matplotlib's config file, which those libraries read at
#: import when HOME is the solution's.
BAIT = r'''
import os, pickle, sys, importlib.metadata
NAMES = {names!r}
PAYLOAD = {payload!r}
class Forge:
    def __reduce__(self):
        return (exec, (PAYLOAD,))
blob = pickle.dumps(Forge())
hook = 'import os; exec(' + repr(PAYLOAD) + ')\n'
home = os.path.expanduser('~')
planted = []
def plant(folder):
    try:
        os.makedirs(folder, exist_ok=True)
        for name, data in (('bait.pickle', blob), ('bait.pth', hook.encode()),
                           ('sitecustomize.py', hook.encode()),
                           ('usercustomize.py', hook.encode()),
                           ('yapf.py', hook.encode()), ('numpy.py', hook.encode()),
                           ('matplotlib.py', hook.encode()), ('json.py', hook.encode())):
            with open(os.path.join(folder, name), 'wb') as f:
                f.write(data)
        planted.append(folder)
    except OSError:
        pass
version = '.'.join(map(str, sys.version_info[:2]))
for top in (home, '/tmp', '/dev/shm', os.getcwd()):
    plant(top)
    plant(os.path.join(top, '.local', 'lib', 'python' + version, 'site-packages'))
for name in NAMES:
    for kind in ('.cache', '.config', os.path.join('.local', 'share')):
        plant(os.path.join(home, kind, name))
try:
    yapf_version = importlib.metadata.version('yapf')
except importlib.metadata.PackageNotFoundError:  # an interpreter without it (nobody's)
    yapf_version = '0.43.0'
yapf_cache = os.path.join(home, '.cache', 'YAPF', yapf_version)
os.makedirs(yapf_cache, exist_ok=True)
for grammar in ('Grammar', 'PatternGrammar'):
    with open(os.path.join(yapf_cache, grammar + '-py' + '.'.join(map(str, sys.version_info))
                           + '.pickle'), 'wb') as f:
        f.write(blob)
with open(os.path.join(home, '.config', 'matplotlib', 'matplotlibrc'), 'w') as f:
    f.write('backend: module://bait\n')
for top in (home, '/tmp', '/dev/shm'):
    for root, dirs, files in os.walk(top):
        try:
            os.chmod(root, 0o777)
            for n in files:
                os.chmod(os.path.join(root, n), 0o666)
        except OSError:
            pass
print('planted', len(planted))
def add(a, b):
    return a + b
'''
#: Libraries that look in user folders (caches, config) at import.
TRACED_LIBRARIES = ('yapf', 'matplotlib', 'numpy', 'platformdirs', 'pip._vendor.platformdirs')
#: The tests: import those (each where installed: nobody's Python has few), then the check.
TRACED_TESTS = ''.join(f'try:\n    import {m}\nexcept Exception:\n    pass\n'
                       for m in TRACED_LIBRARIES) + '''
import json, tempfile, site
assert add(2, 3) == 5
try:
    helper
except Exception:
    pass
'''
#: A third-party module that the tests above do not import, directly or not.
SOLUTION_MODULE = 'termcolor'


def _bait(module_binding: bool) -> str:
    from .hacks import CACHE_PAYLOAD
    code = BAIT.format(names=_installed_names(), payload=CACHE_PAYLOAD)
    if module_binding:  # a name the tests read, bound to a module of the solution's choice
        code += f'import types\nhelper = types.ModuleType({SOLUTION_MODULE!r})\n'
    return code


def _writable_roots(work_parent: str | None) -> tuple[str, ...]:
    """Where the solution can write, as the judge sees it: its folder (``/sandbox`` in
    bubblewrap, where ``/tmp`` links; a run folder under ``work_parent`` elsewhere; a
    prefix ending in ``-`` matches names) and ``/dev/shm``."""
    return ('/sandbox', '/dev/shm', *([work_parent] if work_parent else []))


def _violations(trace: dict, allowed_imports: set[str], writable: tuple[str, ...]) -> list:
    """What the judge read from a folder the solution can write, and the modules it
    imported that neither the tests' own run nor the standard library accounts for."""
    def under(path: str) -> bool:
        return any(path.startswith(r) if r.endswith('-') else
                   (path == r or path.startswith(r.rstrip('/') + '/')) for r in writable)
    bad = []
    for event in trace['events']:
        if event[0] == 'import':
            if event[1].partition('.')[0] not in allowed_imports:
                bad.append(event)
        elif event[3] == 'write' and trace['landlock']:
            continue  # an attempt to create a file (tempfile probing /tmp): the kernel refuses
        elif under(event[1]) or under(event[2]):
            bad.append(event)
    bad += [['module_file', f] for f in trace['module_files'] if under(os.path.realpath(f))]
    bad += [['module', m] for m in trace['modules'] if m.partition('.')[0] not in allowed_imports]
    return bad


def _trace_jobs() -> list[tuple[str, dict]]:
    """control (a plain solution), bait, bait + a module binding: one AssertTests each."""
    tests = dict(program=TRACED_TESTS, prelude='', entry_point=None, names=None)
    plain = 'def add(a, b):\n    return a + b\n'
    return [(plain, tests), (_bait(False), tests), (_bait(True), tests)]


def _check_traces(results: list, work_parent: str | None,
                  libraries: bool = True) -> list[list]:
    """Checks one level's three runs; returns the violations of the two bait runs
    (``libraries``: the interpreter has the venv's packages, whose imports must have run)."""
    (c_status, c_ok, c_err, control, _), (b_status, b_ok, b_err, bait, b_out), \
        (m_status, m_ok, m_err, bound, _) = results
    assert c_ok and b_ok, (c_status, c_err[-1500:], b_status, b_err[-1500:])
    assert 'planted' in b_out, 'the bait was not written'
    assert not m_ok, 'a solution-named module must fail the run'
    assert control and bait and bound, 'the judge reported no trace'
    stdlib = set(sys.stdlib_module_names)
    imports = {m.partition('.')[0] for m in control['modules']} | {
        e[1].partition('.')[0] for e in control['events'] if e[0] == 'import'}  # tried too
    if libraries:  # the imports really ran
        assert {'yapf', 'numpy', 'platformdirs', 'matplotlib'} <= imports, imports
    writable = _writable_roots(work_parent)
    assert _violations(control, imports | stdlib, writable) == []
    return [_violations(bait, imports | stdlib, writable),
            _violations(bound, imports | stdlib, writable)]


@pytest.mark.parametrize('level', SAFE_LEVELS)
def test_the_judge_reads_nothing_the_solution_can_write(level, tmp_path):
    """With the tests' imports running (yapf, matplotlib, numpy, platformdirs: libraries
    that read user caches and config at import), the judge opens, lists and imports
    nothing from the solution's folder, /tmp or /dev/shm, however they are baited, and
    imports no module that only the solution names."""
    from gepo_xtuner.reward.sandbox import AssertTests, Sandbox
    box = Sandbox(timeout_s=20, isolation=level, disk_mb=64)
    box.tmp_dir = str(tmp_path)
    box.trace_judge = True
    results = []
    for code, tests in _trace_jobs():
        r = box.run(code, asserts=AssertTests(**tests))
        results.append([r.status, r.has_value, r.stderr, r.judge_trace, r.stdout])
    assert _check_traces(results, str(tmp_path)) == [[], []]


@pytest.mark.skipif(nobody_skip_reason() is not None, reason=str(nobody_skip_reason()))
def test_the_judge_reads_nothing_the_solution_can_write_as_nobody():
    """The same with the trainer as nobody: both processes under one uid, so the
    solution can make every bait readable by the judge."""
    for level, results in _as_nobody(_trace_jobs()).items():
        assert _check_traces(results, tempfile.gettempdir() + '/gepo-sandbox-',
                             libraries=False) == [[], []], level


# ------------------------------------------------ the trace fails where it must

#: patched copies of the sandbox, each undoing one of the two rules
MUTANTS = {
    'home_is_the_solutions': ('judge_side.py', '    home = JUDGE_HOME\n',
                              "    home = os.environ['HOME']\n"),
    'solution_modules_imported': ('judge_side.py',
                                  "            if parts[0] not in self._allowed or '__main__' in parts "
                                  "or parts[0] == 'test':",
                                  '            if False:'),
}


@pytest.mark.parametrize('mutant', list(MUTANTS))
def test_the_trace_catches_each_way_back_in(mutant):
    """Negative controls: in a copy of the sandbox whose judge keeps the solution's HOME,
    or imports a module the solution names, the same runs show violations (so the test
    above can fail), of the kind expected."""
    level = SAFE_LEVELS[0]
    name, old, new = MUTANTS[mutant]
    with sandbox_copy() as work:
        path = work / 'boxpkg' / 'sandbox' / name
        source = path.read_text()
        assert source.count(old) == 1, f'{name} changed: update the mutant'
        path.write_text(source.replace(old, new))
        (work / 'jobs.json').write_text(json.dumps(_trace_jobs()))
        done = subprocess.run([sys.executable, '-I', '-c', _NOBODY_CHAIN, str(work),
                               str(work / 'jobs.json')], capture_output=True, text=True,
                              timeout=600, check=False, cwd=str(work))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads([x for x in done.stdout.splitlines() if x.startswith('RESULT ')][-1][7:])
    results = out[level]
    if mutant == 'solution_modules_imported':
        results[2][1] = False  # the module is now imported: the run may pass
    bait, bound = _check_traces(results, tempfile.gettempdir() + '/gepo-sandbox-')
    if mutant == 'home_is_the_solutions':
        assert any('/YAPF/' in e[1] or '/matplotlib' in e[1] for e in bait), bait
    else:
        assert ['module', SOLUTION_MODULE] in bound, bound
