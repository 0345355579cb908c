"""How ``make test`` hands the suite to its two pytest-xdist workers (``tests/conftest.py``).

Files that use one session-scoped real server are one work unit, so the server starts once per
run rather than once per worker; units start longest first, by ``tests/durations.json``, and
xdist's own reordering by test count does not undo that order.
"""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import conftest

ROOT = Path(__file__).resolve().parents[1]
TESTS = sorted((ROOT / 'tests').rglob('test_*.py'))
SERVER = conftest._SHARED_SERVERS[0]  # vLLM's (named once here: this file is no user of it)


def test_the_files_that_use_a_shared_server_are_one_unit_and_no_other_joins_it():
    users = [p for p in TESTS if re.search(rf"\b{SERVER}\b", p.read_text())]
    assert len(users) >= 3  # the server's own tests, the backend contract, the overlap runs
    assert {conftest._work_unit(p) for p in users} == {SERVER}
    others = {conftest._work_unit(p) for p in TESTS if p not in users}
    assert others == {str(p.relative_to(ROOT)) for p in TESTS if p not in users}


def test_the_scheduler_splits_node_ids_into_those_units_and_keeps_the_suites_order():
    xdist = pytest.importorskip('xdist')
    assert xdist  # the dev extra
    config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=True, dist='loadfile',
                                                    numprocesses=2, maxschedchunk=None),
                             getvalue=lambda name: 'loadfile')
    sched = conftest.pytest_xdist_make_scheduler(config, log=None)
    assert config.option.loadscopereorder is False
    assert sched._split_scope('tests/test_vllm/test_server.py::test_x') == SERVER
    assert sched._split_scope('tests/test_rollout/test_conformance.py::test_c[HF]') == SERVER
    assert sched._split_scope('tests/test_registry.py::test_y[a::b]') == 'tests/test_registry.py'
    config.getvalue = lambda name: 'load'
    assert conftest.pytest_xdist_make_scheduler(config, log=None) is None  # xdist's own


def test_units_start_longest_first_and_keep_their_files_together(tmp_path, monkeypatch):
    """A unit's time is the sum of its files'; a file not measured yet counts as longest."""
    root = tmp_path
    (root / 'tests').mkdir()
    sources = {'a.py': 'x', 'b.py': SERVER, 'c.py': 'x', 'd.py': SERVER,
               'new.py': 'x'}
    for name, text in sources.items():
        (root / 'tests' / name).write_text(text)
    (root / 'tests' / 'durations.json').write_text(json.dumps(
        {'tests/a.py': 50.0, 'tests/b.py': 30.0, 'tests/c.py': 40.0, 'tests/d.py': 25.0}))
    monkeypatch.setattr(conftest, 'ROOT', root)
    monkeypatch.setattr(conftest, '_work_unit', conftest._work_unit.__wrapped__)
    items = [SimpleNamespace(path=root / 'tests' / name, name=f'{name}:{i}')
             for name in ('a.py', 'b.py', 'c.py', 'd.py', 'new.py') for i in range(2)]
    conftest._longest_units_first(items)
    order = [item.name for item in items]
    # new.py: unmeasured, counted as 50 + 1; b + d share the server: 55 s
    assert order == ['b.py:0', 'b.py:1', 'd.py:0', 'd.py:1', 'new.py:0', 'new.py:1',
                     'a.py:0', 'a.py:1', 'c.py:0', 'c.py:1']
