"""Turn sampled responses into padded training tensors, minibatches and micro-batch inputs."""

import math
from collections.abc import Sequence
from dataclasses import dataclass
import torch
from torch import Tensor

from ...model.inputs import LossInputs
from ...ops.multimodal import MMInputs, concat_mm_inputs
from ...rollout import RolloutSample


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
        """A sub-batch, trimmed to its longest prompt and longest response.

        Prompts are left-padded and responses right-padded, so the columns cut are
        padding in every selected row: positions (counted from the attention mask)
        and the response columns' alignment are unchanged.
        """
        mask = self.response_mask[index]
        width = max(1, int(mask.sum(1).max()))
        cut = self.response_width - width  # responses are right-padded: drop trailing pad
        end = self.input_ids.shape[1] - cut
        attention = self.attention_mask[index, :end]
        prompt_width = self.input_ids.shape[1] - self.response_width
        used = attention[:, :prompt_width].any(0).nonzero()
        start = int(used[0]) if len(used) else prompt_width  # leading all-padding columns
        return ResponseBatch(self.input_ids[index, start:end], attention[:, start:],
                             mask[:, :width], self.rollout_logprobs[index, :width],
                             self.group_index[index], self.mm_inputs)

    def lengths(self) -> tuple[Tensor, Tensor]:
        """``(prompt_lengths, response_lengths)``, each ``(N,)`` long (real tokens)."""
        prompt_width = self.input_ids.shape[1] - self.response_width
        return (self.attention_mask[:, :prompt_width].sum(1),
                self.response_mask.sum(1).long())

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


@dataclass
class Rollouts:
    """What the rollout stage of a step hands on: the prompts, their samples, the tensors.

    Attributes:
        records: the step's B prompt records (this rank's).
        samples: ``samples[b]`` are the K responses to ``records[b]``.
        batch: the N = B * K responses as padded tensors (:func:`build_response_batch`).
        version: the weight version every response was sampled with (RL steps whose
            update the rollout engine held); the step index minus it is the staleness.
        seconds: wall time of the generation when it ran apart from the step (generated
            ahead, ``train_cfg.max_staleness``); None: the step's rollout stage.
    """

    records: list[dict]
    samples: list[list[RolloutSample]]
    batch: ResponseBatch
    version: int = 0
    seconds: float | None = None

    @property
    def row_records(self) -> list[dict]:
        """The prompt record of each of the N rows."""
        return [self.records[g] for g in self.batch.group_index.tolist()]


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
            row.append(s if cut is None else RolloutSample(
                s.response_ids[:cut], s.logprobs[:cut], 'length', s.weight_version,
                None if s.token_versions is None else s.token_versions[:cut]))
        out.append(row)
    return out


def minibatches(rows: Tensor, count: int, generator: torch.Generator | None = None
                ) -> list[Tensor]:
    """``rows`` shuffled and split into ``count`` blocks whose sizes differ by at most one.

    Args:
        rows: ``(n,)`` long, the row indices to train on (all rows, or those an
            advantage processor kept).
        count: number of minibatches (optimizer steps); the same on every rank, so
            a block may be empty when a processor removed rows.
        generator: random source of the shuffle (default: torch's global RNG, which
            the loop checkpoints).
    """
    order = rows[torch.randperm(len(rows), generator=generator)]
    return list(order.tensor_split(count))


#: How the loop trains the rows an advantage processor kept (``train_cfg.kept_rows``).
KEPT_ROWS = ('full_minibatches', 'spread')


def kept_minibatches(rows: Tensor, kept_total: int, minibatch_responses_per_rank: int,
                     world_size: int, generator: torch.Generator | None = None) -> list[Tensor]:
    """The kept rows in minibatches of full size: fewer optimizer steps, as AEPO's authors
    trained (verl v0.4 ``dp_actor.update_policy``: ``batch.split(ppo_mini_batch_size)``).

    With ``K`` rows kept over all ranks and ``m = minibatch_responses_per_rank``, every rank
    takes ``S = ceil(K / (m * world_size))`` optimizer steps (0 when nothing is kept: no
    update, as an empty batch gives none). A rank splits its shuffled rows into blocks of
    ``b = max(m, ceil(k_r / S))`` rows (``k_r`` its own kept rows): full blocks first,
    the remainder last, then empty blocks up to ``S``. On one rank, or ranks that kept
    equal shares, ``b = m``: the authors' split
    exactly (4096 rows, minibatch 512, 30 % kept: 3 steps of 512, 512 and 205 rows).
    A rank that kept more than its share uses larger blocks rather than leave rows out
    (the authors' code first evens the shares across ranks, dropping at most
    ``world_size - 1`` rows).

    Args:
        rows: ``(k_r,)`` long, this rank's kept row indices.
        kept_total: ``K``, kept rows over all ranks (all-reduced).
        minibatch_responses_per_rank: responses per optimizer step and rank.
        world_size: data-parallel ranks.
        generator: random source of the shuffle (default: torch's global RNG).

    Returns:
        ``S`` index tensors (some possibly empty), the same count on every rank.
    """
    m = minibatch_responses_per_rank
    steps = math.ceil(kept_total / (m * world_size))
    if steps == 0:
        return []
    block = max(m, math.ceil(len(rows) / steps))
    order = rows[torch.randperm(len(rows), generator=generator)]
    blocks = list(order.split(block))
    return blocks + [rows[:0]] * (steps - len(blocks))


def padded_tokens(prompt_lengths: Tensor, response_lengths: Tensor) -> int:
    """Positions of the padded ``[left-padded prompt | right-padded response]`` block:
    ``n * (max prompt length + max response length)``, the size one forward sees."""
    if len(prompt_lengths) == 0:
        return 0
    return len(prompt_lengths) * (int(prompt_lengths.max()) + max(1, int(response_lengths.max())))


def _pack(order: list[int], prompt: dict[int, int], response: dict[int, int], cap: int,
          packed: bool = False) -> list[list[int]]:
    """Greedy packing of rows (in ``order``) into blocks of size <= ``cap``.

    Size: the padded block, ``rows x (max prompt + max response)``, or with
    ``packed`` the real tokens, ``sum (prompt + response)``. A row that alone
    exceeds ``cap`` gets a block of its own.
    """
    blocks: list[list[int]] = []
    block: list[int] = []
    max_p = max_r = total = 0
    for i in order:
        p, r = max(max_p, prompt[i]), max(max_r, response[i], 1)
        t = total + prompt[i] + response[i]
        if block and (t if packed else (len(block) + 1) * (p + r)) > cap:
            blocks.append(block)
            block, p, r, t = [], prompt[i], max(response[i], 1), prompt[i] + response[i]
        block.append(i)
        max_p, max_r, total = p, r, t
    if block:
        blocks.append(block)
    return blocks


def micro_batches(rows: Tensor, prompt_lengths: Tensor, response_lengths: Tensor,
                  max_tokens: int | None, packed: bool = False) -> list[Tensor]:
    """Splits one minibatch into micro-batches by a padded-token budget.

    Rows are sorted by length (longest first) and packed greedily into the
    fewest micro-batches whose padded block, ``n_rows * (max prompt + max
    response)`` positions (:func:`padded_tokens`), fits ``max_tokens``; then the
    cap is lowered by bisection as far as the same number of micro-batches still
    holds, which balances their sizes. Sorting keeps padding low: rows of
    similar length share a block. A row longer than the budget alone forms its
    own micro-batch. The gradient does not depend on the split: every
    micro-batch's loss is normalised by the whole minibatch's counts.

    Args:
        rows: ``(n,)`` long row indices of the minibatch.
        prompt_lengths, response_lengths: ``(N,)`` real lengths of ALL rows of the
            batch (indexed by ``rows``).
        max_tokens: the budget, or None for one micro-batch.
        packed: the micro-batches run padding-free (``RLPolicy.packs``): the budget
            counts real tokens, ``sum (prompt + response)``, instead of the padded
            block.

    Returns:
        Index tensors (subsets of ``rows``) covering ``rows`` exactly once; empty
        for an empty minibatch.

    Example:
        >>> p, r = torch.tensor([2, 2, 2, 2]), torch.tensor([6, 6, 2, 2])
        >>> [m.tolist() for m in micro_batches(torch.arange(4), p, r, 16)]
        [[0, 1], [2, 3]]
    """
    if len(rows) == 0:
        return []
    if max_tokens is None:
        return [rows]
    ids = rows.tolist()
    prompt = {i: int(prompt_lengths[i]) for i in ids}
    response = {i: int(response_lengths[i]) for i in ids}
    order = sorted(ids, key=lambda i: -(prompt[i] + response[i]))  # stable: ties keep order
    count = len(_pack(order, prompt, response, max_tokens, packed))
    low, high = 1, max_tokens
    while low < high:  # the smallest cap that still needs no more than `count` blocks
        mid = (low + high) // 2
        if len(_pack(order, prompt, response, mid, packed)) <= count:
            high = mid
        else:
            low = mid + 1
    return [torch.tensor(block, dtype=rows.dtype)
            for block in _pack(order, prompt, response, high, packed)]


def loss_inputs(batch: ResponseBatch, rows: torch.Tensor, old_logprobs: torch.Tensor,
                advantages: torch.Tensor, totals: torch.Tensor, *, temperature: float,
                norm_length: float | None, behaviour_weights: torch.Tensor | None = None,
                loss_mask: torch.Tensor | None = None) -> LossInputs:
    """The policy's :class:`~gepo_xtuner.model.inputs.LossInputs` of one micro-batch.

    Args:
        batch: the step's responses; ``rows`` ``(m,)`` selects the micro-batch.
        old_logprobs: ``(N, R)`` old-policy logprobs of the batch (the proximal policy's,
            recomputed by the trainer).
        advantages: ``(N,)``.
        totals: ``(2,)`` or more float64: valid tokens and non-empty responses of the
            WHOLE minibatch over all ranks (the loss denominators; counted on
            ``loss_mask`` where given), then anything else the caller reduced with them
            (the update passes the minibatch's rows third).
        temperature: the sampling temperature the responses were drawn at.
        norm_length: Dr.GRPO's constant length (``train_cfg.norm_length``).
        behaviour_weights: ``(N, R)`` per-token loss weights of the batch: ``min(w, C)``
            per token or ``min(W, C)`` on every token of a response (the truncate
            corrections), or None.
        loss_mask: ``(N, R)`` bool, the tokens the loss counts (the mask corrections and
            the veto), or None for every response token.
    """
    part = batch.rows(rows)
    width = part.response_width
    return LossInputs(part.input_ids, part.attention_mask, part.response_mask,
                      old_logprobs=old_logprobs[rows, :width],
                      advantages=advantages[rows], num_tokens=totals[0].float(),
                      num_seqs=totals[1].float(), norm_length=norm_length,
                      temperature=temperature,
                      mm_inputs=None if part.mm_inputs is None else part.multimodal_inputs(),
                      behaviour_weights=None if behaviour_weights is None
                      else behaviour_weights[rows, :width],
                      loss_mask=None if loss_mask is None else loss_mask[rows, :width])
