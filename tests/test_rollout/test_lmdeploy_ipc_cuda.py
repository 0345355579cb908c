"""CUDA-IPC weight sync (GPU only): the trainer's CUDA tensors, rebuilt in the server
process from their IPC handles the way LMDeploy's model agent does it, by
LMDeployProtocolDouble (not LMDeploy) run as a subprocess through ``launch.command``."""

import copy
import os
import sys

import pytest
import torch

from gepo_xtuner.rollout import LMDeployRolloutBackend, RolloutRequest

from .conftest import ROOT, load_policy
from .test_lmdeploy_launch import GREEDY, PROMPTS, _expected, _perturb

DOUBLE_COMMAND = [sys.executable, '-m', 'tests.test_rollout.protocol_double', '{model_path}',
                  '--server-name', '{host}', '--server-port', '{port}',
                  '--logprobs-mode', 'raw_logprobs']
# the checkout first, then what the caller's path has (tools/gpu_run.sh's wheels)
DOUBLE_ENV = {'PYTHONPATH': os.pathsep.join(filter(None, (str(ROOT), os.environ.get('PYTHONPATH')))),
              'OMP_NUM_THREADS': '1'}

pytestmark = pytest.mark.gpu  # skipped without CUDA (tests/conftest.py)


def test_ipc_weight_sync_with_sleep_and_wake(tiny_model_dir, tmp_path):
    model, tok = load_policy(tiny_model_dir)
    model.cuda()
    backend = LMDeployRolloutBackend(
        launch={'model_path': str(tiny_model_dir), 'port': 0, 'command': DOUBLE_COMMAND,
                'env': DOUBLE_ENV, 'log_file': str(tmp_path / 'server.log'),
                'startup_timeout_s': 60},
        weight_sync={'mode': 'ipc', 'bucket_bytes': 1 << 16})
    try:
        backend.attach(model, tok)
        backend.generate([RolloutRequest(p) for p in PROMPTS], GREEDY)  # then it sleeps
        _perturb(model, seed=1)
        backend.update_weights(model)  # wake weights, push, wake kv cache
        got = [g[0].response_ids for g in backend.generate(
            [RolloutRequest(p) for p in PROMPTS], GREEDY)]
        assert got == _expected(copy.deepcopy(model).cpu(), tok)
    finally:
        backend.close()
