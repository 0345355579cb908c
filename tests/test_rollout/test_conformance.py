"""Every registered rollout backend against the contract of ``RolloutBackend``.

The in-process backend runs a real tiny model. The LMDeploy backend talks to LMDeploy's
own API server code, run on CPU with a stand-in for its GPU engine
(``lmdeploy_cpu_engine.py``); the contract checked is the client's side. The vLLM
backend talks to a real ``vllm serve`` (vLLM's CPU build, its own engine) serving the same
policy. A backend added to the registry must be
added to ``MAKERS`` or this test fails. :func:`check_contract` is the contract as one
function, for backends registered elsewhere (``test_server_base.py``).
"""

from collections.abc import Callable

import pytest
import torch

from gepo_xtuner.testbed.tiny import EOS_ID
from gepo_xtuner.registry import ROLLOUT_BACKENDS, shipped
from gepo_xtuner.rollout import RolloutBackend, RolloutRequest, SamplingParams

from .conftest import load_policy

PROMPTS = [[1, 5, 9, 12], [1, 7], [1, 20, 21, 22, 23, 30]]


def hf(request):
    return ROLLOUT_BACKENDS.build(dict(type='HFRolloutBackend'))


def lmdeploy(request):
    server = request.getfixturevalue('real_server')
    return ROLLOUT_BACKENDS.build(dict(type='LMDeployRolloutBackend', server_url=server.url,
                                       weight_sync=dict(mode='none'), timeout_s=30.0))


def vllm(request):
    server = request.getfixturevalue('vllm_server')
    # mode 'disk': attach pushes the policy's weights (the session's server may hold others)
    return ROLLOUT_BACKENDS.build(dict(type='VLLMRolloutBackend', server_url=server.url,
                                       weight_sync=dict(mode='disk'), timeout_s=120.0))


MAKERS = {'HFRolloutBackend': hf, 'LMDeployRolloutBackend': lmdeploy,
          'VLLMRolloutBackend': vllm}


def test_every_registered_backend_is_checked():
    assert set(shipped(ROLLOUT_BACKENDS)) == set(MAKERS)


def check_contract(backend: RolloutBackend, make: Callable[[], RolloutBackend],
                   model_dir) -> None:
    """The contract every backend keeps: ``backend`` (built, not attached) is attached to
    the tiny policy of ``model_dir``, generates, takes a weight update, and its state
    round-trips into a ``make()``-built twin; both are closed at the end. A backend of
    another engine (``test_server_base.py``) is checked with this too."""
    assert isinstance(backend, RolloutBackend)
    model, tok = load_policy(model_dir)
    backend.attach(model, tok)
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=6, stop_token_ids=(EOS_ID, ))
    # a rank with nothing to sample still calls generate (it may be collective)
    assert backend.generate([], params) == []
    out = backend.generate([RolloutRequest(list(p)) for p in PROMPTS], params)
    assert len(out) == len(PROMPTS) and all(len(group) == 3 for group in out)
    for group in out:
        for sample in group:
            ids = sample.response_ids
            assert 1 <= len(ids) <= 6 and len(sample.logprobs) == len(ids)
            assert all(lp <= 1e-6 for lp in sample.logprobs)
            stops = [i for i, t in enumerate(ids) if t == EOS_ID]
            if sample.finish_reason == 'stop':
                assert stops == [len(ids) - 1]  # ends at the first stop token, kept
            else:
                assert sample.finish_reason == 'length' and len(ids) == 6 and not stops
    backend.update_weights(model)  # every rank calls it; here: weights unchanged
    state = backend.state_dict()
    assert isinstance(state, dict)
    fresh = make()
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    backend.close()
    fresh.close()


@pytest.mark.parametrize('name', sorted(MAKERS))
def test_contract(name, request, tiny_model_dir):
    check_contract(MAKERS[name](request), lambda: MAKERS[name](request), tiny_model_dir)


@pytest.mark.parametrize('name', sorted(MAKERS))
def test_logprobs_are_at_the_declared_temperature(name, request, tiny_model_dir):
    """Sampled at temperature 0.7, a backend's logprobs are ``log_softmax(logits / t)`` of
    the teacher-forced policy with the ``t`` its ``logprob_temperature`` declares (the RL
    loop refuses off-policy corrections where ``t`` is not the sampling temperature)."""
    backend = MAKERS[name](request)
    model, tok = load_policy(tiny_model_dir)
    backend.attach(model, tok)
    params = SamplingParams(n=2, temperature=0.7, max_new_tokens=6, stop_token_ids=(EOS_ID, ))
    declared = backend.logprob_temperature(params)
    groups = backend.generate([RolloutRequest(list(p)) for p in PROMPTS[:2]], params)
    backend.close()
    for prompt, group in zip(PROMPTS, groups):
        for s in group:
            ids = torch.tensor([prompt + s.response_ids])
            with torch.no_grad():
                logits = model(ids).logits[0, len(prompt) - 1:-1].float()
            for t in (declared, 1.0 if declared != 1.0 else 0.7):
                expected = torch.log_softmax(logits / t, -1).gather(
                    -1, ids[0, len(prompt):, None])[:, 0]
                close = torch.allclose(torch.tensor(s.logprobs), expected, atol=1e-4, rtol=0)
                assert close == (t == declared), (name, t, declared)
