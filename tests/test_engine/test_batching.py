"""Micro-batches by a real-token budget when the policy packs sequences."""

import torch

from gepo_xtuner.engine.batching import micro_batches, padded_tokens


def test_packed_budget_counts_real_tokens_and_needs_fewer_micro_batches():
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 15, (64, ), generator=gen)
    response = torch.exp(torch.randn(64, generator=gen) * 0.9 + 4).long().clamp(1, 600)
    rows = torch.arange(64)
    cap = 2048
    packed = micro_batches(rows, prompt, response, cap, packed=True)
    padded = micro_batches(rows, prompt, response, cap)
    for parts in (packed, padded):
        assert sorted(torch.cat(parts).tolist()) == rows.tolist()
    for m in packed:
        assert len(m) == 1 or int((prompt[m] + response[m]).sum()) <= cap
    for m in padded:
        assert len(m) == 1 or padded_tokens(prompt[m], response[m]) <= cap
    assert len(packed) < len(padded)
