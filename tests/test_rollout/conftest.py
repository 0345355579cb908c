"""LMDeploy's own API server on CPU serving the session's tiny policy (``tiny_model_dir``,
tests/conftest.py), and a protocol double for failure injection (both in threads)."""

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def on_one_thread(one_thread) -> None:
    """Every rollout test on one thread (``tests/conftest.py:one_thread``)."""


@pytest.fixture
def double(tiny_model_dir):
    """A protocol double (not LMDeploy) on a free local port, serving from a thread."""
    from .protocol_double import LMDeployProtocolDouble
    d = LMDeployProtocolDouble(str(tiny_model_dir)).start()
    yield d
    d.stop()


def load_policy(model_dir: Path):
    """The policy as the trainer holds it: float32 model and tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture
def lmdeploy_server(tiny_model_dir):
    """A factory of LMDeploy's own API server (``serve()`` as shipped, in a thread) with a
    CPU stand-in for its PyTorch engine (``lmdeploy_cpu_engine.py``), serving the tiny
    policy; keyword arguments as :class:`LMDeployCPUServer`. All are stopped at teardown."""
    from .lmdeploy_cpu_engine import LMDeployCPUServer
    servers = []

    def start(model_dir=None, **kwargs) -> 'LMDeployCPUServer':
        server = LMDeployCPUServer(str(model_dir or tiny_model_dir), **kwargs)
        servers.append(server)
        return server.start()
    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def real_server(lmdeploy_server):
    """One LMDeploy API server (its own code, CPU stand-in engine) with the defaults."""
    return lmdeploy_server()
