"""Micro-batches by a real-token budget when the policy packs sequences."""

import math

import pytest
import torch

from gepo_xtuner.engine.step.batching import (kept_minibatches, micro_batches, minibatches,
                                              padded_tokens)


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


def authors_split(n_kept: int, minibatch: int) -> list[int]:
    """verl v0.4 ``dp_actor.update_policy`` on one rank's kept batch:
    ``batch.split(ppo_mini_batch_size)``, full minibatches, the remainder last."""
    return [min(minibatch, n_kept - start) for start in range(0, n_kept, minibatch)]


@pytest.mark.parametrize('n,kept_frac,minibatch', [(4096, 0.3, 512), (4096, 0.5, 512),
                                                    (64, 0.25, 8), (64, 1 / 64, 8)])
def test_aepo_kept_rows_take_fewer_full_size_steps_as_the_authors_ran_them(n, kept_frac,
                                                                           minibatch):
    g = torch.Generator().manual_seed(0)
    keep = torch.zeros(n, dtype=torch.bool)
    keep[torch.randperm(n, generator=g)[:round(n * kept_frac)]] = True
    rows = keep.nonzero().flatten()
    blocks = kept_minibatches(rows, len(rows), minibatch, world_size=1, generator=g)
    assert [len(b) for b in blocks] == authors_split(len(rows), minibatch)
    assert len(blocks) == math.ceil(n * kept_frac / minibatch) < math.ceil(n / minibatch)
    assert torch.equal(torch.cat(blocks).sort().values, rows)  # every kept row, once
    # the full batch's step count with the kept rows spread over it ('spread')
    spread = minibatches(rows, math.ceil(n / minibatch), generator=g)
    assert len(spread) == n // minibatch and max(len(b) for b in spread) < minibatch


def test_kept_rows_on_several_ranks_step_together():
    """Every rank takes ceil(K / (minibatch x P)) steps; equal shares split as the authors'."""
    per_rank = {'equal': (600, 600), 'unequal': (700, 500), 'one-sided': (1200, 0)}
    sizes = {name: [[len(b) for b in kept_minibatches(torch.arange(k), sum(ks), 256, 2)]
                    for k in ks] for name, ks in per_rank.items()}
    assert sizes['equal'] == [authors_split(600, 256)] * 2 == [[256, 256, 88]] * 2
    assert sizes['unequal'] == [[256, 256, 188], [256, 244, 0]]
    assert sizes['one-sided'] == [[400, 400, 400], [0, 0, 0]]  # no row left out
    assert kept_minibatches(torch.arange(0), 0, 256, 2) == []  # nothing kept: no update
