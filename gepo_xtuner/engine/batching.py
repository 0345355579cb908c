"""Turn sampled responses into padded training tensors."""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..ops.multimodal import MMInputs, concat_mm_inputs
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
        mm_inputs: for vision-language prompts, each prompt's multimodal tensors
            (``pixel_values``, ``image_grid_thw``, ...; ``{}`` for a prompt without
            images), indexed by ``group_index``. Kept per prompt, not per row, so any
            row selection gathers exactly its rows' images (see
            :meth:`multimodal_inputs`). ``None`` for text-only steps.
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    rollout_logprobs: Tensor
    group_index: Tensor
    mm_inputs: list[MMInputs] | None = None

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
                             self.group_index[index], self.mm_inputs)

    def multimodal_inputs(self, index: Tensor | None = None) -> MMInputs:
        """The model's multimodal inputs for rows ``index`` (default: all), in row order.

        Each row contributes its prompt's tensors, concatenated along dim 0 (for
        Qwen2-VL: the patches of the row's images and one ``image_grid_thw`` line per
        image), so they line up with the image tokens of ``input_ids[index]``.
        ``{}`` for text-only batches.
        """
        if self.mm_inputs is None:
            return {}
        groups = self.group_index if index is None else self.group_index[index]
        return concat_mm_inputs([self.mm_inputs[g] for g in groups.tolist()])


def build_response_batch(prompts: Sequence[list[int]], samples: Sequence[Sequence[RolloutSample]],
                         pad_token_id: int, mm_inputs: Sequence[MMInputs] | None = None
                         ) -> ResponseBatch:
    """Pads B prompts with K samples each into one :class:`ResponseBatch`.

    Args:
        prompts: B prompts as the model scores them (image placeholders expanded).
        samples: ``samples[b]`` are prompt b's responses.
        pad_token_id: fills the padding.
        mm_inputs: optional per-prompt multimodal tensors (``{}`` for text prompts).
    """
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
    return ResponseBatch(input_ids, attention_mask, response_mask, logprobs, group_index,
                         None if mm_inputs is None else list(mm_inputs))


def cut_at_tokens(samples: Sequence[Sequence[RolloutSample]], token_ids: Sequence[int]
                  ) -> list[list[RolloutSample]]:
    """Ends every response before its first token in ``token_ids`` (finish reason 'length').

    For a vision-language policy these are its image placeholder tokens
    (:func:`~gepo_xtuner.ops.multimodal.placeholder_token_ids`), which a server may
    sample but the trainer cannot score. The kept tokens and their logprobs are
    unchanged, as if the length cap had ended the response there.
    """
    stop = set(token_ids)
    out = []
    for group in samples:
        row = []
        for s in group:
            cut = next((t for t, tok in enumerate(s.response_ids) if tok in stop), None)
            row.append(s if cut is None else
                       RolloutSample(s.response_ids[:cut], s.logprobs[:cut], 'length'))
        out.append(row)
    return out


def minibatches(n: int, size: int, generator: torch.Generator | None = None
                ) -> Iterator[Tensor]:
    """Shuffled index blocks of ``size`` covering ``range(n)`` (the last may be smaller)."""
    order = torch.randperm(n, generator=generator)
    for start in range(0, n, size):
        yield order[start:start + size]
