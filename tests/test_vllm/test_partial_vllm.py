"""Partial rollouts against a real ``vllm serve`` (vLLM 0.32's CPU build, the session's
server, float32): the streaming stage with ``partial_rollout=True`` pushes new weights
(``weight_sync`` mode ``'disk'``, the push check on) while 384-token responses are being
generated (long enough that the abort reaches the engine before they end, on a loaded
2-core machine), and every token is accounted for (``tests/test_rollout/partial_check.py``
says what is checked)."""

from ..test_rollout.conftest import load_policy
from ..test_rollout.partial_check import push_during_long_responses
from .test_server import backend_for


def test_a_push_during_long_responses_keeps_every_token_and_its_version(vllm_server,
                                                                        tiny_model_dir):
    model, tok = load_policy(tiny_model_dir)
    backend = backend_for(vllm_server.url, weight_sync=dict(mode='disk', probe_tolerance=1e-3))
    backend.attach(model, tok)  # pushes the policy (the server may hold another test's)
    try:
        push_during_long_responses(backend, model, steps=6, most_steps=16, groups=4,
                                   new_tokens=384,
                                   streamed=True)
    finally:
        backend.close()
