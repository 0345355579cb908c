"""How ``make test`` hands the suite to its two pytest-xdist workers (``tests/conftest.py``).

Files that use one session-scoped real server are one work unit, so the server starts once per
run rather than once per worker; units start longest first, by ``tests/durations.json``, and
xdist's own reordering by test count does not undo that order. The scheduler is xdist's own
``loadfile`` scheduling with our units; the workers are recording stand-ins with the three
members the scheduler calls (xdist's ``WorkerController`` needs a live execnet gateway).
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


class RecordingWorker:
    """What xdist's scheduler calls on a worker: the test indexes it is sent (also in
    ``log``, shared by the workers, in the order they were sent), and shutdown."""

    def __init__(self, name: str, log: list[int]) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []
        self.log = log

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent += indexes
        self.log += indexes

    def shutdown(self) -> None:
        self.shutting_down = True


def _config(root: Path, reorder: bool = True) -> SimpleNamespace:
    """The parts of a pytest config xdist's ``loadfile`` scheduler reads: ``-n 2``."""
    values = {'dist': 'loadfile', 'tx': ['2*popen'], 'numprocesses': 2}
    return SimpleNamespace(option=SimpleNamespace(loadscopereorder=reorder, **values),
                           getvalue=values.__getitem__, rootpath=root)


def test_the_files_that_use_a_shared_server_are_one_unit_and_no_other_joins_it():
    users = [p for p in TESTS if re.search(rf'\b{SERVER}\b', p.read_text())]
    # the server's own tests, the backend contract, the overlapped runs
    assert {'test_server.py', 'test_conformance.py', 'test_overlap_vllm.py'} <= {
        p.name for p in users}
    ids = {p: str(p.relative_to(ROOT)) for p in TESTS}
    assert {conftest._work_unit(ids[p]) for p in users} == {SERVER}
    assert all(conftest._work_unit(ids[p]) == ids[p] for p in TESTS if p not in users)


def test_xdist_runs_the_units_whole_in_the_suites_order(tmp_path):
    """Two workers, five files, one pair sharing the server: each unit goes to one worker
    whole, in collection order (xdist's reordering by test count would start ``many.py``,
    the file of most tests, first)."""
    xdist = pytest.importorskip('xdist')
    assert xdist  # the dev extra
    files = {'long.py': 2, 'b.py': 1, 'many.py': 6, 'd.py': 1, 'short.py': 2}
    for name in files:
        (tmp_path / name).write_text(SERVER if name in ('b.py', 'd.py') else 'x')
    collection = [f'{name}::test_{i}[a::b]' for name, n in files.items() for i in range(n)]
    config = _config(tmp_path)
    sched = conftest.pytest_xdist_make_scheduler(config, log=None)
    assert isinstance(sched, conftest._UnitScheduling) and not config.option.loadscopereorder
    log: list[int] = []
    workers = [RecordingWorker('gw0', log), RecordingWorker('gw1', log)]
    for worker in workers:
        sched.add_node(worker)
        sched.add_node_collection(worker, collection)
    sched.schedule()
    done = {w: 0 for w in workers}
    while not sched.tests_finished:  # the workers run their tests in turn and ask for more
        for worker in workers:
            if done[worker] < len(worker.sent):
                sched.mark_test_complete(worker, worker.sent[done[worker]])
                done[worker] += 1
    handed = [collection[i].split('::')[0] for i in log]
    order = [u for k, u in enumerate(handed) if k == 0 or u != handed[k - 1]]
    assert order == ['long.py', 'b.py', 'd.py', 'many.py', 'short.py']
    assert sorted(log) == list(range(len(collection)))  # each test once
    ran = [{collection[i].split('::')[0] for i in w.sent} for w in workers]
    assert all(ran)  # both worked
    for unit in [{'long.py'}, {'b.py', 'd.py'}, {'many.py'}, {'short.py'}]:
        assert sum(unit <= files_ for files_ in ran) == 1, (unit, ran)  # whole, on one
    config = _config(tmp_path)
    config.getvalue = {'dist': 'load', 'tx': ['2*popen']}.__getitem__
    assert conftest.pytest_xdist_make_scheduler(config, log=None) is None  # xdist's own


def test_units_start_longest_first_and_keep_their_files_together(tmp_path):
    """A unit's time is the sum of its files'; a file not measured yet counts as longest."""
    sources = {'a.py': 'x', 'b.py': SERVER, 'c.py': 'x', 'd.py': SERVER, 'new.py': 'x'}
    for name, text in sources.items():
        (tmp_path / name).write_text(text)
    table = tmp_path / 'durations.json'
    table.write_text(json.dumps({'a.py': 50.0, 'b.py': 30.0, 'c.py': 40.0, 'd.py': 25.0}))
    items = [SimpleNamespace(nodeid=f'{name}::test_{i}', fixturenames=[])
             for name in ('a.py', 'b.py', 'c.py', 'd.py', 'new.py') for i in range(2)]
    conftest._longest_units_first(items, tmp_path, table)
    # new.py: unmeasured, counted as 50 + 1; b + d share the server: 55 s
    assert [item.nodeid for item in items] == [
        'b.py::test_0', 'b.py::test_1', 'd.py::test_0', 'd.py::test_1', 'new.py::test_0',
        'new.py::test_1', 'a.py::test_0', 'a.py::test_1', 'c.py::test_0', 'c.py::test_1']


def test_a_test_that_gets_the_server_from_a_file_that_never_names_it_is_refused(tmp_path):
    """Through another fixture, say: the file would go to any worker, which would start a
    second server; the error says where to name it."""
    (tmp_path / 'e.py').write_text('def test_x(server_user): ...')
    items = [SimpleNamespace(nodeid='e.py::test_x', fixturenames=['server_user', SERVER])]
    with pytest.raises(pytest.UsageError, match=rf"e.py::test_x uses the fixture '{SERVER}' "
                       r'without naming it in e.py'):
        conftest._longest_units_first(items, tmp_path, tmp_path / 'none.json')
