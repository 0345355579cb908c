"""Greedy validation on a held-out prompt file, per domain, across ranks."""

from typing import Any

import torch

from ..data.jsonl import PromptDataset
from ..ops.distributed import all_reduce_sum
from ..rollout import RolloutRequest, SamplingParams


class Validator:
    """Scores the policy's greedy (or configured) answers on a held-out JSONL set.

    Each rank takes every world-size-th record; per-domain sums and counts are
    all-reduced, so every rank logs the same ``val/<domain>/acc`` (mean reward:
    accuracy for 0/1 rewards) and ``val/acc`` (mean over domains).

    Args:
        path: JSONL file in :class:`~gepo_xtuner.data.jsonl.PromptDataset` format,
            read (and validated) when the loop is built.
        interval: validate every ``interval`` steps, before the first and after the last.
        max_new_tokens: response cap; defaults to the training sampling's.
        temperature: 0 (default) is greedy decoding.
    """

    def __init__(self, path: str, interval: int = 10, max_new_tokens: int | None = None,
                 temperature: float = 0.0) -> None:
        if interval < 1:
            raise ValueError(f'val interval must be >= 1, got {interval}')
        self.dataset = PromptDataset(path)
        self.interval = interval
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.domains = sorted({r['domain'] for r in self.dataset.records})

    def run(self, loop: Any) -> dict[str, float]:
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        rank = torch.distributed.get_rank() if world > 1 else 0
        records = self.dataset.records[rank::world]
        params = SamplingParams(
            n=1, temperature=self.temperature,
            max_new_tokens=self.max_new_tokens or loop.sampling.max_new_tokens,
            stop_token_ids=loop.sampling.stop_token_ids)
        samples = loop.rollout.generate([RolloutRequest(p) for p in loop._tokenize(records)],
                                        params)
        texts = loop.policy.tokenizer.batch_decode([g[0].response_ids for g in samples],
                                                  skip_special_tokens=True)
        rewards, _ = loop.rewards(texts, records)
        index = torch.tensor([self.domains.index(r['domain']) for r in records], dtype=torch.long)
        sums = torch.zeros(len(self.domains), 2, dtype=torch.float64)
        sums.index_add_(0, index, torch.stack([rewards.double(), torch.ones_like(rewards,
                                                                                dtype=torch.float64)], 1))
        sums = all_reduce_sum(sums)
        acc = (sums[:, 0] / sums[:, 1].clamp_min(1)).tolist()
        metrics = {f'val/{d}/acc': a for d, a in zip(self.domains, acc)}
        metrics['val/acc'] = sum(acc) / len(acc)
        return metrics
