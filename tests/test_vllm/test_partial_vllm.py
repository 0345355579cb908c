"""Partial rollouts against a real ``vllm serve`` (vLLM 0.32's CPU build, the session's
server, float32): the streaming stage with ``partial_rollout=True`` pushes new weights
while long responses are being generated, and every token is accounted for.

The stage is driven in the loop's call order; each "update" perturbs the tiny policy and
pushes it into the server (``weight_sync`` mode ``'disk'``, the push check on). Each
version's weights are kept, so every trained token can be scored by the trainer under
the version it is labelled with: its logprob must be that version's, a response must be
whole (``max_new_tokens`` tokens, nothing lost or repeated at a cut), versions must not
decrease along a response, and no token may be more than ``k`` versions old.
"""

import copy
import itertools
import time
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch

from gepo_xtuner.engine.step.batching import Rollouts, build_response_batch
from gepo_xtuner.engine.step.rollout_stage import build_rollout_stage
from gepo_xtuner.engine.train_cfg import StageSettings
from gepo_xtuner.rollout import RolloutRequest, SamplingParams

from .test_server import backend_for, perturb
from ..test_rollout.conftest import load_policy

K = 2
B = 4  # groups per batch
NEW = 96  # tokens per response (the server's max_model_len is 128)
PARAMS = SamplingParams(n=4, temperature=1.0, max_new_tokens=NEW, stop_token_ids=())


def scored(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """The trainer's ``log p(response[t] | prompt, response[:t])`` (float32)."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def test_a_push_during_long_responses_keeps_every_token_and_its_version(vllm_server,
                                                                        tiny_model_dir):
    model, tok = load_policy(tiny_model_dir)
    backend = backend_for(vllm_server.url, weight_sync=dict(mode='disk', probe_tolerance=1e-3))
    backend.attach(model, tok)  # pushes version 0 (the server may hold another test's)
    versions = [copy.deepcopy(model.state_dict())]
    steps = 5
    source = ([dict(id=100 * s + i) for i in range(B)] for s in itertools.count())
    prompts = {}

    def encode(records):
        out = []
        for r in records:
            prompts[r['id']] = [1, 4 + r['id'] % 40, 5 + r['id'] % 7]
            out.append(RolloutRequest(prompts[r['id']], extra={'ignore_eos': True}))
        return out

    stage = build_rollout_stage(StageSettings(K, partial_rollout=True, groups_in_flight=2),
                                backend, source, encode, lambda: 11, max_steps=steps)
    stage.start()
    trained = []
    try:
        for step in range(steps):
            records = stage.next_records()
            samples, _, _ = stage.responses(step, records, stage.encode(records), PARAMS,
                                            step + 1 == steps)
            trained.append((step, records, samples))
            stage.before_sync(lambda name: nullcontext())
            perturb(model, seed=step)
            backend.update_weights(model)  # a real push: the server reloads
            versions.append(copy.deepcopy(model.state_dict()))
            batch = build_response_batch([prompts[r['id']] for r in records], samples, 0)
            metrics = stage.step_metrics(step, Rollouts(records, samples, batch, 0, 1.0), 1.0)
            trained[-1] += (metrics, )
            stage.end_step(SimpleNamespace(hooks=[], iter=step), steps, [{}])
    finally:
        stage.finish()
        backend.close()
    scorer = copy.deepcopy(model)
    cut, worst = 0, 0.0
    for step, records, samples, metrics in trained:
        assert metrics['rollout/staleness_max'] <= K
        for record, group in zip(records, samples):
            assert len(group) == PARAMS.n
            for sample in group:
                assert sample.finish_reason == 'length' and len(sample.response_ids) == NEW
                labels = sample.versions()
                assert labels == sorted(labels) and all(0 <= step - v <= K for v in labels)
                cut += len(set(labels)) > 1
                for v in sorted(set(labels)):
                    scorer.load_state_dict(versions[v])
                    mine = [t for t, u in enumerate(labels) if u == v]
                    want = scored(scorer, prompts[record['id']], sample.response_ids)[mine]
                    got = torch.tensor(sample.logprobs)[mine]
                    worst = max(worst, (got - want).abs().max().item())
                    if v + 1 < len(versions):  # the next version would not fit them
                        scorer.load_state_dict(versions[v + 1])
                        other = scored(scorer, prompts[record['id']],
                                       sample.response_ids)[mine]
                        assert (got - other).abs().max().item() > 1e-2
    assert worst < 1e-3, worst  # each token's logprob is its own version's
    assert cut > 0, 'no push landed during a response; the test needs one'
    assert sum(m['rollout/partial_responses'] for *_, m in trained) == cut
