"""A launched server's lifecycle and disk weight sync: LMDeploy's own API server code with
the CPU stand-in engine (``lmdeploy_cpu_engine.py``) as a real subprocess, through the
backend's ``launch.command``; start-up failures with stand-in commands."""

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from gepo_xtuner.testbed.tiny import EOS_ID
from gepo_xtuner.rollout import (
    HFRolloutBackend,
    LMDeployRolloutBackend,
    RolloutRequest,
    SamplingParams,
)

from .conftest import ROOT, load_policy

SERVER_COMMAND = [sys.executable, '-m', 'tests.test_rollout.lmdeploy_cpu_engine', '{model_path}',
                  '--server-name', '{host}', '--server-port', '{port}',
                  '--logprobs-mode', 'raw_logprobs', '--enable-abort-handling']
SERVER_ENV = {'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1'}
# Answers GET /health with 200 and nothing else: a server that starts in milliseconds.
HEALTH_ONLY = textwrap.dedent("""
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.send_header('Content-Length', '0'); self.end_headers()
    http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
""")
PROMPTS = [[1, 14, 20, 33], [1, 9, 9, 8]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=(EOS_ID,))


def _expected(model, tok) -> list[list[int]]:
    hf = HFRolloutBackend()
    hf.attach(model, tok)
    return [g[0].response_ids for g in hf.generate([RolloutRequest(p) for p in PROMPTS], GREEDY)]


def _generated(backend) -> list[list[int]]:
    return [g[0].response_ids for g in backend.generate([RolloutRequest(p) for p in PROMPTS],
                                                        GREEDY)]


def _perturb(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen).to(p.device) * 0.5)


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_launch_then_disk_weight_sync_restarts_on_new_weights(tiny_model_dir, tmp_path):
    model, tok = load_policy(tiny_model_dir)
    backend = LMDeployRolloutBackend(
        launch={'model_path': str(tiny_model_dir), 'port': 0, 'command': SERVER_COMMAND,
                'env': SERVER_ENV, 'log_file': str(tmp_path / 'server.log'),
                'startup_timeout_s': 60},
        weight_sync={'mode': 'disk', 'shared_dir': str(tmp_path / 'weights'), 'keep': 1})
    try:
        backend.attach(model, tok)
        first_pid = backend.server.proc.pid
        assert _generated(backend) == _expected(model, tok)
        before = _expected(model, tok)
        _perturb(model, seed=1)
        backend.update_weights(model)
        after = _expected(model, tok)
        assert after != before  # the check below can tell old weights from new
        assert _generated(backend) == after
        assert _gone(first_pid)  # the old server was stopped, not leaked
        saved = tmp_path / 'weights' / 'step_1'
        assert {'model.safetensors', 'config.json', 'tokenizer.json'} <= \
            {f.name for f in saved.iterdir()}
        _perturb(model, seed=2)
        backend.update_weights(model)
        assert _generated(backend) == _expected(model, tok)
        assert sorted(p.name for p in (tmp_path / 'weights').iterdir()) == ['step_2']
    finally:
        pid = backend.server.proc.pid if backend.server.proc else None
        backend.close()
    assert pid is not None and _gone(pid)
    assert 'CPU stand-in engine' in (tmp_path / 'server.log').read_text()


def test_launch_failure_shows_the_log(tmp_path):
    backend = LMDeployRolloutBackend(launch={
        'model_path': 'm', 'port': 0, 'log_file': str(tmp_path / 'log'),
        'command': [sys.executable, '-c', 'import sys; print("no GPU found"); sys.exit(3)']})
    with pytest.raises(RuntimeError, match=r'(?s)exited with code 3.*no GPU found'):
        backend.attach(None, None)
    backend.close()


def test_a_port_in_use_is_refused_before_launching():
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0))
        busy.listen()
        port = busy.getsockname()[1]
        backend = LMDeployRolloutBackend(launch={'model_path': 'm', 'port': port,
                                                 'command': [sys.executable, '-c', 'pass']})
        with pytest.raises(RuntimeError, match=f'port {port} on 127.0.0.1 is already in use'):
            backend.attach(None, None)
    assert backend.server.proc is None


def test_launch_timeout_stops_the_process(tmp_path):
    log = tmp_path / 'log'
    backend = LMDeployRolloutBackend(launch={
        'model_path': 'm', 'port': 0, 'startup_timeout_s': 1.0, 'log_file': str(log),
        'command': [sys.executable, '-c',
                    'import os, time; print(os.getpid(), flush=True); time.sleep(60)']})
    with pytest.raises(TimeoutError, match=r'not healthy after 1 s \(launch.startup_timeout_s'):
        backend.attach(None, None)
    assert _gone(int(log.read_text().split()[-1]))
    backend.close()


def test_a_crashing_trainer_does_not_leak_the_server(tmp_path):
    trainer = textwrap.dedent(f"""
        import sys
        from gepo_xtuner.rollout import LMDeployRolloutBackend
        backend = LMDeployRolloutBackend(launch=dict(
            model_path='m', port=0, log_file={str(tmp_path / 'log')!r},
            command=[sys.executable, '-c', {HEALTH_ONLY!r}, '{{port}}']))
        backend.attach(None, None)
        print(backend.server.proc.pid, flush=True)
        raise RuntimeError('the trainer crashed')
    """)
    proc = subprocess.run([sys.executable, '-c', trainer], capture_output=True, text=True,
                          env={**os.environ, **SERVER_ENV}, timeout=120, check=False)
    assert proc.returncode == 1 and 'the trainer crashed' in proc.stderr
    assert _gone(int(proc.stdout.split()[0]))
