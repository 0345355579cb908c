"""Partial rollouts against LMDeploy's own API server (its code as shipped, with the CPU
stand-in for its PyTorch engine, in a process of its own as the backend launches it,
``--enable-abort-handling`` from the launch command): the streaming stage with
``partial_rollout=True`` pushes new weights over LMDeploy's weight-update-group protocol
(gloo) while 96-token responses are being generated; ``POST /abort_request`` cuts them,
LMDeploy answers each with its tokens so far, and they are continued on the new weights.
Every token is accounted for (``partial_check.py`` says what is checked)."""

from gepo_xtuner.rollout import LMDeployRolloutBackend

from .conftest import load_policy
from .partial_check import push_during_long_responses
from .test_lmdeploy_real_server import SERVER_COMMAND, SERVER_ENV


def test_a_push_during_long_responses_keeps_every_token_and_its_version(tiny_model_dir,
                                                                        tmp_path):
    model, tok = load_policy(tiny_model_dir)
    backend = LMDeployRolloutBackend(launch={
        'model_path': str(tiny_model_dir), 'port': 0, 'command': SERVER_COMMAND,
        'env': SERVER_ENV, 'log_file': str(tmp_path / 'server.log'), 'startup_timeout_s': 120},
        max_retries=0, timeout_s=120,
        weight_sync={'mode': 'nccl', 'backend': 'gloo', 'timeout_s': 60,
                     'bucket_bytes': 1 << 16, 'probe_tolerance': 1e-3})
    backend.attach(model, tok)
    try:
        push_during_long_responses(backend, model, steps=3)
    finally:
        backend.close()
    log = (tmp_path / 'server.log').read_text()
    assert 'Traceback' not in log
