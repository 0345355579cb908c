"""Turn sampled responses into padded training tensors."""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..rollout import RolloutSample


@dataclass
class ResponseBatch:
    """N = B * K responses as ``[left-padded prompt | right-padded response]`` rows.

    Attributes:
        input_ids: ``(N, P + R)`` long.
        attention_mask: ``(N, P + R)`` long.
        response_mask: ``(N, R)`` bool.
        rollout_logprobs: ``(N, R)`` float32, the backend's logprobs (0 at padding).
        group_index: ``(N,)`` long, prompt index within the step.
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    rollout_logprobs: Tensor
    group_index: Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def response_width(self) -> int:
        return self.response_mask.shape[1]

    def rows(self, index: Tensor) -> 'ResponseBatch':
        """A sub-batch, trimmed to the longest response it contains."""
        mask = self.response_mask[index]
        width = max(1, int(mask.sum(1).max()))
        cut = self.response_width - width  # responses are right-padded: drop trailing pad
        end = self.input_ids.shape[1] - cut
        return ResponseBatch(self.input_ids[index, :end], self.attention_mask[index, :end],
                             mask[:, :width], self.rollout_logprobs[index, :width],
                             self.group_index[index])


def build_response_batch(prompts: Sequence[list[int]], samples: Sequence[Sequence[RolloutSample]],
                         pad_token_id: int) -> ResponseBatch:
    """Pads B prompts with K samples each into one :class:`ResponseBatch`."""
    flat = [(g, prompts[g], s) for g, group in enumerate(samples) for s in group]
    n = len(flat)
    p = max(len(prompt) for _, prompt, _ in flat)
    r = max(1, max(len(s.response_ids) for _, _, s in flat))
    input_ids = torch.full((n, p + r), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, p + r), dtype=torch.long)
    response_mask = torch.zeros((n, r), dtype=torch.bool)
    logprobs = torch.zeros((n, r), dtype=torch.float32)
    for i, (_, prompt, sample) in enumerate(flat):
        k = len(sample.response_ids)
        input_ids[i, p - len(prompt):p] = torch.tensor(prompt, dtype=torch.long)
        input_ids[i, p:p + k] = torch.tensor(sample.response_ids, dtype=torch.long)
        attention_mask[i, p - len(prompt):p + k] = 1
        response_mask[i, :k] = True
        logprobs[i, :k] = torch.tensor(sample.logprobs, dtype=torch.float32)
    group_index = torch.tensor([g for g, _, _ in flat], dtype=torch.long)
    return ResponseBatch(input_ids, attention_mask, response_mask, logprobs, group_index)


def minibatches(n: int, size: int, generator: torch.Generator | None = None
                ) -> Iterator[Tensor]:
    """Shuffled index blocks of ``size`` covering ``range(n)`` (the last may be smaller)."""
    order = torch.randperm(n, generator=generator)
    for start in range(0, n, size):
        yield order[start:start + size]
