"""Sample responses to records and score them: the step shared by validation and evaluation."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...reward import RewardRouter
from ...rollout import RolloutBackend, RolloutRequest, SamplingParams


@dataclass
class ScoredSamples:
    """``n`` scored responses to each of N records.

    Attributes:
        completions: ``[record][sample]`` decoded responses (special tokens skipped).
        rewards: ``(N, n)`` float32.
        errors: ``[record][sample]`` the reward function's failure
            (``'Type: message'``, scored 0) or None.
        finish_reasons: ``[record][sample]`` ``'stop'`` or ``'length'``.
        response_tokens: ``[record][sample]`` generated token counts.
    """

    completions: list[list[str]]
    rewards: torch.Tensor
    errors: list[list[str | None]]
    finish_reasons: list[list[str]]
    response_tokens: list[list[int]]


def sample_and_score(rollout: RolloutBackend, tokenizer: Any, rewards: RewardRouter,
                     records: Sequence[dict[str, Any]], requests: Sequence[RolloutRequest],
                     params: SamplingParams) -> ScoredSamples:
    """Generates ``params.n`` responses per record and scores each with ``rewards``.

    Args:
        rollout: an attached rollout backend.
        tokenizer: decodes the responses.
        rewards: the reward router.
        records: N records.
        requests: their rollout requests (see
            :func:`gepo_xtuner.engine.step.prompt_encoding.encode_request`).
        params: sampling parameters (``n``, temperature, length cap, stop tokens).

    Returns:
        The responses and their rewards; an empty ``records`` still calls the
        backend (some backends' ``generate`` is collective across ranks).
    """
    n = params.n
    if len(requests) != len(records):
        raise ValueError(f'{len(requests)} requests for {len(records)} records')
    groups = rollout.generate(list(requests), params)
    flat = [s for group in groups for s in group]
    texts = tokenizer.batch_decode([s.response_ids for s in flat], skip_special_tokens=True)
    values, _, failures = rewards.score(texts, [r for r in records for _ in range(n)])

    def nest(items: list) -> list[list]:
        return [items[i * n:(i + 1) * n] for i in range(len(records))]

    return ScoredSamples(completions=nest(texts), rewards=values.view(len(records), n),
                         errors=nest(failures),
                         finish_reasons=nest([s.finish_reason for s in flat]),
                         response_tokens=nest([len(s.response_ids) for s in flat]))
