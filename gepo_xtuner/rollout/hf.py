"""In-process rollouts with ``transformers`` generation on the policy being trained."""

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig

from ..ops.token import gather_logprobs
from ..registry import ROLLOUT_BACKENDS
from .base import RolloutBackend, RolloutRequest, RolloutSample, SamplingParams


@ROLLOUT_BACKENDS.register_module()
class HFRolloutBackend(RolloutBackend):
    """Batched sampling with ``model.generate`` in the trainer process.

    The backend samples from the very module being trained, so weight sync is
    free; it switches the module to eval mode (and back) around generation.
    Prompts are left-padded into batches of at most ``batch_size`` sequences
    (``len(requests) * n`` sequences in all). Sampling uses the global torch RNG,
    which the training loop checkpoints, so a resumed run samples the same tokens.

    Args:
        batch_size: sequences per ``generate`` call (memory bound).

    Image inputs are not supported by this backend (raise); use a multimodal
    backend for prompts that carry images.
    """

    def __init__(self, batch_size: int = 256) -> None:
        if batch_size < 1:
            raise ValueError(f'batch_size must be >= 1, got {batch_size}')
        self.batch_size = batch_size
        self.model: nn.Module | None = None
        self.pad_token_id: int | None = None

    def attach(self, model: nn.Module, tokenizer: Any) -> None:
        self.model = model
        self.pad_token_id = tokenizer.pad_token_id
        if self.pad_token_id is None:
            raise ValueError('the tokenizer has no pad_token_id; set tokenizer.pad_token')

    @torch.no_grad()
    def generate(self, requests: Sequence[RolloutRequest], params: SamplingParams
                 ) -> list[list[RolloutSample]]:
        if self.model is None:
            raise RuntimeError('HFRolloutBackend.generate called before attach(model, tokenizer)')
        if any(r.images for r in requests):
            raise ValueError('HFRolloutBackend does not take images; configure a multimodal '
                             'rollout backend for prompts with images')
        flat = [r.input_ids for r in requests for _ in range(params.n)]
        samples: list[RolloutSample] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(flat), self.batch_size):
                samples.extend(self._generate_batch(flat[start:start + self.batch_size], params))
        finally:
            self.model.train(was_training)
        return [samples[i * params.n:(i + 1) * params.n] for i in range(len(requests))]

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams
                        ) -> list[RolloutSample]:
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, p in enumerate(prompts):  # left padding: the last prompt token ends each row
            input_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attention_mask[i, width - len(p):] = 1
        greedy = params.temperature == 0
        config = GenerationConfig(
            do_sample=not greedy, temperature=None if greedy else params.temperature,
            top_p=None if greedy else params.top_p, top_k=None if greedy else params.top_k,
            max_new_tokens=params.max_new_tokens, pad_token_id=self.pad_token_id,
            eos_token_id=list(params.stop_token_ids) or None, output_logits=True,
            return_dict_in_generate=True)
        out = self.model.generate(input_ids=input_ids.to(device),
                                  attention_mask=attention_mask.to(device),
                                  generation_config=config)
        generated = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1)  # raw logits, (B, S, V)
        logprobs = gather_logprobs(logits, generated).cpu()
        return [self._trim(ids, lps, params) for ids, lps in zip(generated.cpu().tolist(), logprobs)]

    @staticmethod
    def _trim(ids: list[int], logprobs: torch.Tensor, params: SamplingParams) -> RolloutSample:
        stops = set(params.stop_token_ids)
        for t, tok in enumerate(ids):
            if tok in stops:
                return RolloutSample(ids[:t + 1], logprobs[:t + 1].tolist(), 'stop')
        return RolloutSample(ids, logprobs.tolist(), 'length')
