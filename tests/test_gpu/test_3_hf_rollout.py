"""``HFRolloutBackend`` on CUDA in bf16: the sampled tokens' logprobs match the trainer's.

Samples 64 new tokens for 32 prompts at temperature 1 (generation: padded batch, KV
cache, the model's SDPA), then scores them with the RL loop's old-logprob pass (packed).
Per token ``|rollout - trainer| <= 0.1 + 0.05 |trainer|`` nats. Prints generated tokens/s.
"""

import pytest
import torch

from gepo_xtuner.model.policy import RLPolicy
from gepo_xtuner.testbed.gpu import record, rollout_vs_trainer

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize('size', ['tiny', 'qwen2-0.5b'])
def test_hf_rollout_logprobs_match_the_trainer_on_cuda(size, model_dirs, device) -> None:
    policy = RLPolicy(str(model_dirs[size]), dict(type='CISPOLoss'),
                      torch_dtype='bfloat16').to(device)
    assert policy.packs, policy.packing_problem
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 50, (int(n), ), generator=gen).tolist()
               for n in torch.randint(6, 40, (32, ), generator=gen)]
    torch.manual_seed(0)
    rollout_vs_trainer(policy, prompts[:2], 4)  # warm-up: kernels, allocator
    result = rollout_vs_trainer(policy, prompts, 64)
    record(f'hf_rollout[{size}]', result)
    assert result['generated_tokens'] == 32 * 64
    assert result['logprobs'].ok, str(result['logprobs'])
