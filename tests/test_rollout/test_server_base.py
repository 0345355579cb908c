"""``gepo_xtuner/rollout/server/`` is the one base of the server backends.

* The engine packages share code only through it: ``rollout/lmdeploy`` and
  ``rollout/vllm`` import nothing of each other, and ``rollout/server`` neither of them.
* A third engine written on it (``openai_completions_backend.py``, registered for these
  tests only) launches its server through the base, waits until it is ready, generates,
  pushes weights as files, keeps the rollout contract (``test_conformance.py``), and is
  reached by a second backend through ``server_url``; all against a stand-in server
  (``openai_completions_standin.py``), not an inference engine.
"""

import ast
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

from gepo_xtuner.registry import ROLLOUT_BACKENDS
from gepo_xtuner.rollout import RolloutRequest, SamplingParams

from .conftest import load_policy
from .openai_completions_backend import CompletionsError, CompletionsRolloutBackend
from .test_conformance import PROMPTS, check_contract

ROLLOUT = Path(__file__).resolve().parents[2] / 'gepo_xtuner' / 'rollout'
ENGINES = ('lmdeploy', 'vllm')


def imports_of(package: Path) -> dict[str, set[str]]:
    """File -> the absolute names of the modules it imports (relative ones resolved)."""
    out = {}
    for path in package.rglob('*.py'):
        parts = ['gepo_xtuner', 'rollout', *path.relative_to(ROLLOUT).with_suffix('').parts]
        here = parts if parts[-1] == '__init__' else parts[:-1]
        here = here[:-1] if here[-1] == '__init__' else here
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = here[:len(here) - node.level + 1] if node.level else []
                module = '.'.join([*base, *([node.module] if node.module else [])])
                names.add(module)
                names.update(f'{module}.{alias.name}' for alias in node.names)
        out[str(path.relative_to(ROLLOUT))] = names
    return out


@pytest.mark.parametrize('package', [*ENGINES, 'server'])
def test_engine_packages_share_code_only_through_rollout_server(package):
    others = [e for e in ENGINES if e != package]
    bad = {f: sorted(n for n in names if any(n == f'gepo_xtuner.rollout.{o}'
                                             or n.startswith(f'gepo_xtuner.rollout.{o}.')
                                             for o in others))
           for f, names in imports_of(ROLLOUT / package).items()}
    assert not {f: n for f, n in bad.items() if n}, f'rollout/{package} imports {others}'


def test_the_import_check_sees_relative_imports():
    names = imports_of(ROLLOUT / 'vllm')['vllm/backend.py']
    assert 'gepo_xtuner.rollout.server.backend' in names and 'gepo_xtuner.rollout.base' in names


@pytest.fixture
def registered():
    """The third engine in the registry for one test (the package does not ship it)."""
    ROLLOUT_BACKENDS.register_module(module=CompletionsRolloutBackend)
    yield
    ROLLOUT_BACKENDS.module_dict.pop(CompletionsRolloutBackend.__name__)


def _launch(model_dir, tmp_path, **extra) -> dict:
    return dict(model_path=str(model_dir), python=sys.executable, port=0,
                log_file=str(tmp_path / 'server.log'), startup_timeout_s=30, **extra)


def test_a_third_engine_on_the_base_launches_generates_and_pushes(registered, tiny_model_dir,
                                                                  tmp_path):
    weights = tmp_path / 'weights'
    launched = ROLLOUT_BACKENDS.build(dict(
        type='CompletionsRolloutBackend', launch=_launch(tiny_model_dir, tmp_path),
        weight_sync=dict(mode='files', shared_dir=str(weights)), timeout_s=10))
    model, tok = load_policy(tiny_model_dir)
    launched.attach(model, tok)  # rank 0 launches; attach returns once /health says 200
    url = launched.url
    assert launched.server.proc.poll() is None and httpx.get(f'{url}/health').status_code == 200

    def attached():
        return ROLLOUT_BACKENDS.build(dict(type='CompletionsRolloutBackend', server_url=url,
                                           weight_sync=dict(mode='files', shared_dir=str(weights)),
                                           timeout_s=10))
    check_contract(attached(), attached, tiny_model_dir)  # generates, pushes version 1
    reloads = httpx.get(f'{url}/reloads').json()
    assert reloads == [str(weights / 'step_1')]
    assert {'config.json', 'model.safetensors'} <= {p.name for p in (weights / 'step_1').iterdir()}

    params = SamplingParams(n=2, max_new_tokens=4)
    before = launched.generate([RolloutRequest(list(PROMPTS[0]))], params)
    launched.update_weights(model)
    assert httpx.get(f'{url}/reloads').json()[-1] == str(weights / 'step_1')  # its own count
    after = launched.generate([RolloutRequest(list(PROMPTS[0]))], params)
    assert [s.response_ids for s in after[0]] != [s.response_ids for s in before[0]]
    assert launched.state_dict() == {'num_updates': 1}
    port = launched.server.port
    launched.close()  # stops the server it launched
    with socket.socket() as s:
        assert s.connect_ex(('127.0.0.1', port)) != 0


def test_the_third_engines_errors_come_from_the_base(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match='exactly one of server_url'):
        CompletionsRolloutBackend()
    with pytest.raises(ValueError, match='launch does not take'):
        CompletionsRolloutBackend(launch=dict(model_path='m', gpus=2))
    backend = CompletionsRolloutBackend(server_url='http://127.0.0.1:9', timeout_s=2)
    with pytest.raises(CompletionsError, match='no healthy completions server') as err:
        backend.attach(None, None)
    assert 'Start one' in str(err.value)
    with pytest.raises(CompletionsError, match='no weight_sync configured'):
        CompletionsRolloutBackend(server_url='http://127.0.0.1:9').update_weights(None)
    failing = CompletionsRolloutBackend(launch=_launch(tiny_model_dir, tmp_path,
                                                       extra_args=['--fail-at-start']))
    with pytest.raises(RuntimeError, match='exited with code 1 during startup') as err:
        failing.attach(None, None)
    # the cause is 60 lines above the log's end, out of the quoted tail
    cause, tail = str(err.value).split('; log ', 1)
    assert cause.endswith(f'first error in its log: ValueError: {tiny_model_dir} is no model')
    assert 'ValueError' not in tail and 'shutting down worker 59' in tail


class _Hung:
    """A stand-in for a hung server: the kernel takes its connections, nobody answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(('127.0.0.1', 0))
        self.sock.listen(64)
        self.url = f'http://127.0.0.1:{self.sock.getsockname()[1]}'


def test_a_hung_server_costs_one_bounded_wait(tiny_model_dir, tmp_path, monkeypatch):
    """A server that takes connections and answers nothing is waited for once (the full
    probe); every later push gives it only the short probe, and says it is still hung."""
    from gepo_xtuner.rollout.server import backend as base
    monkeypatch.setattr(base, 'PROBE_TIMEOUT_S', 2.0)
    monkeypatch.setattr(base, 'HUNG_PROBE_S', 0.1)
    standin = CompletionsRolloutBackend(launch=_launch(tiny_model_dir, tmp_path))
    standin.attach(None, None)
    hung = _Hung()
    backend = CompletionsRolloutBackend(
        server_url=[standin.url, hung.url], timeout_s=10, retry_after_s=0,
        weight_sync=dict(mode='files', shared_dir=str(tmp_path / 'weights')))
    model, tok = load_policy(tiny_model_dir)
    start = time.monotonic()
    backend.attach(model, tok)
    assert time.monotonic() - start >= 1.9  # the one full wait
    for _ in range(2):
        start = time.monotonic()
        backend.update_weights(model)
        assert time.monotonic() - start < 1.5
    metrics = backend.pop_metrics()
    assert metrics['rollout/server/0/ready'] == 1 and metrics['rollout/server/1/ready'] == 0
    assert 'still hung' in backend._pool.servers[1].reason
    backend.close()
    standin.close()
    hung.sock.close()
