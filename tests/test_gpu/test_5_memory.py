"""Peak GPU memory of one RL step (old-logprob pass + update) of the 0.5B Qwen2 in bf16.

Three steps of the loop's own passes on the same workload (64 responses, 4096 tokens per
micro-batch, two optimizer steps): once the optimizer state exists (steps 2 and 3), every
step must leave the same memory allocated after it (within 1 MiB; a step that keeps a
graph, a logits tensor or a gradient alive grows it) and peak at about the same level
(within 5 %: on an H100, torch 2.11, the same batch peaked at 11826 and 11377 MiB in steps
2 and 3 in one run, 11891 and 11442 in another, step 3 below step 2 both times, with the
memory after each step equal to the byte: a spread, not growth). The peak must also lie between the static memory (weights, gradients,
AdamW's two moments) and that plus 24 GiB (a micro-batch of 4096 tokens keeps about 5 GiB
of bf16 activations and 1.2 GiB of logits over the 151936-token vocabulary, their gradient
as much again).
"""

import pytest
import torch

from gepo_xtuner.model.policy import RLPolicy
from gepo_xtuner.testbed.gpu import record
from gepo_xtuner.testbed.rl_step import adamw, rl_step, step_settings, workload

pytestmark = pytest.mark.gpu


def test_peak_memory_per_rl_step_is_steady(model_dirs, device) -> None:
    policy = RLPolicy(str(model_dirs['qwen2-0.5b']), dict(type='CISPOLoss'),
                      torch_dtype='bfloat16').to(device)
    batch, advantages = workload(64, median=128, sigma=0.9, max_len=1024, vocab=50, seed=2)
    optim, settings = adamw(policy), step_settings(max_tokens=4096, minibatch=32)  # 2 steps
    params = sum(p.numel() for p in policy.parameters())
    peaks, after = [], []
    for _ in range(3):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        metrics = rl_step(policy, optim, batch, advantages, settings)
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() / 2**20)
        after.append(torch.cuda.memory_allocated() / 2**20)
    static = params * (2 + 2 + 2 * 2) / 2**20  # bf16 weights, gradients, AdamW moments
    tokens = int(sum(t.sum() for t in batch.lengths()))
    record('memory[qwen2-0.5b]', {
        'params': params, 'real_tokens': tokens, 'max_tokens_per_micro_batch': 4096,
        'peak_mib_per_step': peaks, 'allocated_after_mib': after, 'static_mib': static,
        'grad_norm': metrics.get('optim/grad_norm')})
    assert max(peaks[1:]) <= 1.05 * min(peaks[1:]), peaks
    assert abs(after[2] - after[1]) <= 1.0, after
    assert static <= peaks[-1] <= static + 24 * 1024, (static, peaks)
