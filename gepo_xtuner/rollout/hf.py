"""In-process rollouts with ``transformers`` generation on the policy being trained."""

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import (GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria,
                          StoppingCriteriaList)

from ..ops.multimodal import MMInputs, can_concat, concat_mm_inputs, mm_to, placeholder_token_ids
from ..ops.token import gather_logprobs
from ..registry import ROLLOUT_BACKENDS
from .base import RolloutBackend, RolloutRequest, RolloutSample, SamplingParams


@ROLLOUT_BACKENDS.register_module()
class HFRolloutBackend(RolloutBackend):
    """Batched sampling with ``model.generate`` in the trainer process.

    The backend samples from the very module being trained, so weight sync is
    free; it switches the module to eval mode (and back) around generation.
    Prompts are left-padded into batches of at most ``max_sequences_per_call``
    sequences (``len(requests) * n`` sequences in all). Sampling uses the global torch RNG,
    which the training loop checkpoints, so a resumed run samples the same tokens.

    Prompts with images generate from their processed form
    (:attr:`~gepo_xtuner.rollout.RolloutRequest.model_input_ids` and ``mm_inputs``,
    which the RL loop fills with the policy's processor): the rows' image tensors are
    concatenated along dim 0, so any mix of prompts with and without images shares a
    batch. A processor whose tensors do not concatenate (per-batch padding) gets one
    prompt per ``generate`` call instead. A vision-language model never samples its
    image / video placeholder tokens (``suppress_tokens``): the trainer could not score
    a response holding one. The returned logprobs are those of ``softmax(logits /
    temperature)``, the distribution sampled from (before the suppression, as the
    trainer scores them).

    Length-aware batching: the ``len(requests) * n`` rows are ordered by prompt
    length (stable, so a prompt's n samples stay together) before they are cut into
    ``generate`` calls of at most ``max_sequences_per_call`` rows and
    ``max_tokens_per_call`` padded positions (``rows x (longest prompt + max_new_tokens)``). Rows of a call
    then share a prompt width (little left padding) and, prompts of one task type
    being of similar length, tend to finish together, so fewer finished rows idle
    while the longest one decodes. Results come back in request order. The order is
    a pure function of the prompts, so sampling stays a function of the global RNG
    state (resume reproduces an uninterrupted run).

    Args:
        max_sequences_per_call: sequences per ``generate`` call (memory bound).
        max_tokens_per_call: optional cap on a call's padded positions,
            ``rows x (longest prompt + max_new_tokens)``; a row over it alone gets a
            call of its own. None: only ``max_sequences_per_call`` limits a call.
        sort_by_length: order rows by prompt length before batching (default True);
            False keeps the request order.
    """

    def __init__(self, max_sequences_per_call: int = 256,
                 max_tokens_per_call: int | None = None,
                 sort_by_length: bool = True) -> None:
        if max_sequences_per_call < 1:
            raise ValueError('max_sequences_per_call must be >= 1, got '
                             f'{max_sequences_per_call}')
        if max_tokens_per_call is not None and not (isinstance(max_tokens_per_call, int)
                                                    and max_tokens_per_call >= 1):
            raise ValueError('max_tokens_per_call must be an int >= 1 or None, got '
                             f'{max_tokens_per_call!r}')
        self.max_sequences_per_call = max_sequences_per_call
        self.max_tokens_per_call = max_tokens_per_call
        self.sort_by_length = sort_by_length
        self.model: nn.Module | None = None
        self.pad_token_id: int | None = None
        self.suppress: tuple[int, ...] = ()
        self.own_copy = False  # sampling from a copy of the policy (prepare_overlap)
        self._epoch = 0  # preempt() calls so far: a generate begun before the last one ends
        self.partial = False  # generate can be preempted (prepare_partial)

    def logprob_temperature(self, params: SamplingParams) -> float:
        """The sampling temperature: logprobs are those of ``softmax(logits / temperature)``,
        the distribution sampled (1 for greedy decoding, whose logits are not divided)."""
        return params.temperature if params.temperature > 0 else 1.0

    def overlap_refusal(self) -> str | None:
        return None

    def partial_refusal(self) -> str | None:
        return None

    def prepare_partial(self) -> None:
        """From now on each ``generate`` batch checks for :meth:`preempt` after every
        token."""
        super().prepare_partial()
        self.partial = True

    def preempt(self) -> None:
        """Ends the :meth:`generate` calls begun before it after their current decoding
        step (every row of a ``generate`` batch then has the same number of new tokens);
        rows not yet started come back empty. Returns at once: the caller waits for the
        generating thread."""
        self._epoch += 1

    def prepare_overlap(self) -> None:
        """Samples from a copy of the attached policy from now on; :meth:`update_weights`
        copies the trainer's weights into it."""
        if self.model is None:
            raise RuntimeError('HFRolloutBackend.prepare_overlap called before attach')
        if any(hasattr(p, 'ds_id') for p in self.model.parameters()):
            raise ValueError('train_cfg.max_staleness >= 1 with HFRolloutBackend needs full '
                             'parameters on each rank; DeepSpeed ZeRO-3 partitions them')
        if not self.own_copy:
            self.model = copy.deepcopy(self.model).eval()
            self.model.requires_grad_(False)
            self.own_copy = True

    @torch.no_grad()
    def update_weights(self, model: nn.Module) -> None:
        """Nothing to do when sampling from the trained module itself; with its own copy
        (:meth:`prepare_overlap`), copies ``model``'s parameters and buffers into it."""
        if not self.own_copy:
            return
        mine = self.model.state_dict(keep_vars=True)
        for name, value in model.state_dict(keep_vars=True).items():
            mine[name].data.copy_(value.data)

    def attach(self, model: nn.Module, tokenizer: Any) -> None:
        self.model = model
        self.pad_token_id = tokenizer.pad_token_id
        self.suppress = placeholder_token_ids(getattr(model, 'config', None))
        if self.pad_token_id is None:
            raise ValueError('the tokenizer has no pad_token_id; set tokenizer.pad_token')

    @torch.no_grad()
    def generate(self, requests: Sequence[RolloutRequest], params: SamplingParams
                 ) -> list[list[RolloutSample]]:
        if self.model is None:
            raise RuntimeError('HFRolloutBackend.generate called before attach(model, tokenizer)')
        for i, r in enumerate(requests):
            if r.images and r.mm_inputs is None:
                raise ValueError(
                    f'HFRolloutBackend: request {i} has images but no processed image inputs '
                    '(RolloutRequest.mm_inputs); prompts with images must be encoded with the '
                    "policy's processor (RLPolicy with a vision-language model_class)")
        rows = [(r.prompt_ids, r.mm_inputs or {}) for r in requests for _ in range(params.n)]
        samples: list[RolloutSample | None] = [None] * len(rows)
        generator = None
        if params.seed is not None and params.temperature > 0:  # one stream for all calls
            device = next(self.model.parameters()).device
            generator = torch.Generator(device).manual_seed(params.seed)
        was_training = self.model.training
        epoch = self._epoch
        self.model.eval()
        try:
            for call in self.plan(requests, params):
                if self._epoch != epoch:  # preempted before this batch began
                    for i in call:
                        samples[i] = RolloutSample([], [], 'abort')
                    continue
                for i, sample in zip(call, self._generate_batch(
                        [rows[i] for i in call], params, generator,
                        epoch if self.partial else None)):
                    samples[i] = sample
        finally:
            self.model.train(was_training)
        return [samples[i * params.n:(i + 1) * params.n] for i in range(len(requests))]

    def plan(self, requests: Sequence[RolloutRequest], params: SamplingParams
             ) -> list[list[int]]:
        """The ``generate`` calls: lists of row indices (row ``i * n + k`` is request
        ``i``'s k-th sample), covering every row once, in the order they run.

        Rows are ordered by prompt length (if ``sort_by_length``), then cut greedily at
        ``max_sequences_per_call`` rows or ``max_tokens_per_call`` padded positions.
        Requests whose images cannot share a batch (per-batch image padding) get one call
        per prompt.
        """
        n = params.n
        length = [len(r.prompt_ids) for r in requests for _ in range(n)]
        if can_concat([r.mm_inputs for r in requests if r.mm_inputs]):
            groups = [list(range(len(length)))]
        else:  # a processor that pads images per batch: one prompt per generate call
            groups = [list(range(i * n, (i + 1) * n)) for i in range(len(requests))]
        calls: list[list[int]] = []
        for group in groups:
            if self.sort_by_length:
                group = sorted(group, key=lambda i: length[i])  # stable
            call: list[int] = []
            width = 0
            for i in group:
                wider = max(width, length[i])
                over = (self.max_tokens_per_call is not None and
                        (len(call) + 1) * (wider + params.max_new_tokens)
                        > self.max_tokens_per_call)
                if call and (len(call) == self.max_sequences_per_call or over):
                    calls.append(call)
                    call, wider = [], length[i]
                call.append(i)
                width = wider
            if call:
                calls.append(call)
        return calls

    def _generate_batch(self, rows: list[tuple[list[int], MMInputs]], params: SamplingParams,
                        generator: torch.Generator | None = None, epoch: int | None = None
                        ) -> list[RolloutSample]:
        device = next(self.model.parameters()).device
        width = max(len(p) for p, _ in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, (p, _) in enumerate(rows):  # left padding: the last prompt token ends each row
            input_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attention_mask[i, width - len(p):] = 1
        # text-only rows: no extra arguments, exactly the text-model call
        mm = mm_to(concat_mm_inputs([m for _, m in rows]), device,
                   getattr(self.model, 'dtype', None))
        greedy = params.temperature == 0
        seeded = generator is not None
        extra: dict[str, Any] = {}
        if seeded:  # Gumbel-max with the private generator; HF then takes the argmax
            if params.top_p < 1 or params.top_k > 0:
                raise ValueError('HFRolloutBackend: seeded sampling (SamplingParams.seed) '
                                 'takes the full distribution; top_p < 1 and top_k > 0 are '
                                 'not supported with it')
            extra['logits_processor'] = LogitsProcessorList(
                [GumbelSample(params.temperature, generator)])
        preempted = None
        if epoch is not None:
            preempted = Preempted(self, epoch)
            extra['stopping_criteria'] = StoppingCriteriaList([preempted])
        config = GenerationConfig(
            do_sample=not (greedy or seeded),
            temperature=None if greedy or seeded else params.temperature,
            top_p=None if greedy or seeded else params.top_p,
            top_k=None if greedy or seeded else params.top_k,
            max_new_tokens=params.max_new_tokens, pad_token_id=self.pad_token_id,
            eos_token_id=list(params.stop_token_ids) or None, output_logits=True,
            return_dict_in_generate=True,
            **({'suppress_tokens': list(self.suppress)} if self.suppress else {}))
        out = self.model.generate(input_ids=input_ids.to(device),
                                  attention_mask=attention_mask.to(device),
                                  generation_config=config, **mm, **extra)
        generated = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1)  # raw logits, (B, S, V)
        if not greedy and params.temperature != 1.0:  # the distribution sampled from
            logits = logits / params.temperature
        logprobs = gather_logprobs(logits, generated).cpu()
        cut = preempted is not None and preempted.fired
        return [self._trim(ids, lps, params, cut)
                for ids, lps in zip(generated.cpu().tolist(), logprobs)]

    @staticmethod
    def _trim(ids: list[int], logprobs: torch.Tensor, params: SamplingParams,
              cut: bool = False) -> RolloutSample:
        """The response up to its first stop token; without one: ``'length'`` at the cap,
        ``'abort'`` where :meth:`preempt` cut the batch short."""
        stops = set(params.stop_token_ids)
        for t, tok in enumerate(ids):
            if tok in stops:
                return RolloutSample(ids[:t + 1], logprobs[:t + 1].tolist(), 'stop')
        if cut and len(ids) < params.max_new_tokens:
            return RolloutSample(ids, logprobs.tolist(), 'abort')
        return RolloutSample(ids, logprobs.tolist(), 'length')


class Preempted(StoppingCriteria):
    """Stops a ``generate`` batch once its backend was preempted after the batch began
    (:meth:`HFRolloutBackend.preempt`); ``fired`` says whether it did."""

    def __init__(self, backend: HFRolloutBackend, epoch: int) -> None:
        self.backend, self.epoch, self.fired = backend, epoch, False

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor,
                 **kwargs: Any) -> torch.BoolTensor:
        stop = self.backend._epoch != self.epoch
        self.fired = self.fired or stop
        return torch.full((input_ids.shape[0], ), stop, dtype=torch.bool,
                          device=input_ids.device)


class GumbelSample(LogitsProcessor):
    """Turns greedy decoding into exact sampling from ``softmax(scores / temperature)``.

    ``argmax_v(scores_v / tau + g_v)`` with ``g_v = -log(E_v)``, ``E_v ~ Exp(1)`` i.i.d.
    (Gumbel noise) is a sample of ``softmax(scores / tau)``; the noise comes from
    ``generator``, so sampling consumes no global random state. Tokens already at
    ``-inf`` (suppressed) stay there.

    Args:
        temperature: ``tau`` > 0.
        generator: the private generator, on the scores' device.
    """

    def __init__(self, temperature: float, generator: torch.Generator) -> None:
        self.temperature = float(temperature)
        self.generator = generator

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor
                 ) -> torch.FloatTensor:
        noise = torch.empty(scores.shape, dtype=torch.float32, device=scores.device)
        noise.exponential_(generator=self.generator)
        return scores.float() / self.temperature - noise.log()
