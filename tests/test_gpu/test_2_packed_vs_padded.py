"""Packed vs padded trainer passes in bf16 on CUDA: logprobs, entropies, gradients.

One micro-batch of ragged responses, scored by ``RLPolicy`` packed (flash-attention's
varlen kernel where ``flash_attn`` is installed, else causal SDPA per sequence) and padded
(``[left-padded prompt | right-padded response]`` with the model's SDPA), with the gradient
of ``-sum_i A_i sum_t logprob_it``. Tolerances (``gepo_xtuner.testbed.gpu``): per token
``|packed - padded| <= 0.1 + 0.05 |padded|`` nats for logprobs and entropies, gradient
cosine >= 0.99; and each path within the same bound of an fp32 pass of the same weights.
"""

import pytest
import torch

from gepo_xtuner.testbed.gpu import packed_vs_padded, record
from gepo_xtuner.testbed.rl_step import workload

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize('size', ['tiny', 'qwen2-0.5b'])
def test_packed_and_padded_agree_in_bf16_on_cuda(size, model_dirs, device) -> None:
    batch, _ = workload(24, median=48, sigma=0.9, max_len=400, vocab=50, seed=1)
    result = packed_vs_padded(model_dirs[size], batch, device, torch.bfloat16)
    record(f'packed_vs_padded[{size}]', result)
    for key in ('logprobs', 'entropies', 'packed_vs_fp32', 'padded_vs_fp32'):
        assert result[key].ok, str(result[key])
    grads = result['grads']
    assert grads['cosine'] >= grads['cosine_min'], grads
