"""Trainer logprobs refer to the distribution actually sampled: softmax(logits / tau)."""

import pytest
import torch

from gepo_xtuner.engine.step.batching import build_response_batch
from gepo_xtuner.engine.step.update import check_training_sampling
from gepo_xtuner.model.policy import RLPolicy
from gepo_xtuner.rollout import HFRolloutBackend, RolloutRequest, SamplingParams


def test_trainer_scores_samples_at_the_sampling_temperature(tiny_dir):
    torch.manual_seed(0)
    policy = RLPolicy(pretrained=str(tiny_dir / 'model'), policy_loss=dict(type='CISPOLoss'))
    tok = policy.tokenizer
    backend = HFRolloutBackend()
    backend.attach(policy.llm, tok)
    prompts = [tok('12+34=')['input_ids'], tok('7*8=')['input_ids']]
    params = SamplingParams(n=3, temperature=0.6, max_new_tokens=8,
                            stop_token_ids=(tok.eos_token_id, ))
    samples = backend.generate([RolloutRequest(p) for p in prompts], params)
    batch = build_response_batch(prompts, samples, tok.pad_token_id)
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                  response_mask=batch.response_mask)
    with torch.no_grad():
        at_tau, _ = policy(inputs=dict(inputs, temperature=0.6), mode='logprobs')
        at_one, _ = policy(inputs=inputs, mode='logprobs')
    m = batch.response_mask
    diff_tau = (at_tau - batch.rollout_logprobs)[m].abs().max()
    diff_one = (at_one - batch.rollout_logprobs)[m].abs().max()
    assert diff_tau < 1e-4, diff_tau  # same distribution as the sampler's
    assert diff_one > 1e-2, diff_one  # tau = 1 scores another distribution


@pytest.mark.parametrize('cfg,match', [
    (dict(top_p=0.9), 'top_p=1.0 and top_k=0'),
    (dict(top_k=20), 'top_p=1.0 and top_k=0'),
    (dict(temperature=0.0), 'greedy'),
])
def test_truncated_or_greedy_sampling_is_refused_for_training(cfg, match):
    with pytest.raises(ValueError, match=match):
        check_training_sampling(SamplingParams(**cfg))
    check_training_sampling(SamplingParams(temperature=0.7))
