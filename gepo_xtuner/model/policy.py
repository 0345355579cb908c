"""The policy as an mmengine model: a Hugging Face causal LM plus a policy loss."""

import inspect
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from mmengine.model import BaseModel
from mmengine.registry import MODELS
from torch import Tensor
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..ops.token import gather_logprobs, token_entropy
from ..registry import POLICY_LOSSES


@MODELS.register_module()
class RLPolicy(BaseModel):
    """Causal LM whose ``forward(mode='loss')`` is a configurable policy-gradient loss.

    Batches are ``[prompt | response]`` rows: prompts left-padded to a common
    width P, responses right-padded to width R. Only the R response positions
    are scored, so with ``num_logits_to_keep`` support the LM head runs on R + 1
    positions instead of P + R.

    ``inputs`` (all on the model's device):
        input_ids: ``(B, P + R)`` long.
        attention_mask: ``(B, P + R)`` 0/1.
        response_mask: ``(B, R)`` bool, real response tokens.
        old_logprobs: ``(B, R)`` behaviour-policy logprobs (loss mode).
        advantages: ``(B,)`` (loss mode).
        num_tokens, num_seqs: optional scalars, the aggregation denominators of
            the whole minibatch when it is split into micro-batches.

    Args:
        pretrained: Hugging Face model directory (or hub id where reachable).
        policy_loss: config of a :data:`~gepo_xtuner.registry.POLICY_LOSSES` entry.
        tokenizer: tokenizer directory; defaults to ``pretrained``.
        torch_dtype: parameter dtype, e.g. ``'float32'`` or ``'bfloat16'``.
    """

    def __init__(self, pretrained: str, policy_loss: dict, tokenizer: str | None = None,
                 torch_dtype: str = 'float32', data_preprocessor: dict | None = None,
                 init_cfg: dict | None = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        for what, path in (('model', pretrained), ('tokenizer', tokenizer or pretrained)):
            if path.startswith(('.', '/')) and not Path(path).exists():
                raise FileNotFoundError(
                    f'{what} directory {path!r} does not exist. For the built-in CPU setting '
                    'run `python tools/prepare_tiny_cpu.py` first (make demo does).')
        self.llm = AutoModelForCausalLM.from_pretrained(pretrained,
                                                        torch_dtype=getattr(torch, torch_dtype))
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer or pretrained)
        self.policy_loss = POLICY_LOSSES.build(policy_loss)
        params = inspect.signature(self.llm.forward).parameters
        self._keep_arg = next((k for k in ('logits_to_keep', 'num_logits_to_keep') if k in params),
                              None)

    def response_logits(self, input_ids: Tensor, attention_mask: Tensor, width: int) -> Tensor:
        """Logits that predict the last ``width`` tokens: ``(B, width, V)``."""
        # Left padding: positions count real tokens only, as generation saw them.
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
        kwargs = {self._keep_arg: width + 1} if self._keep_arg else {}
        logits = self.llm(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids, use_cache=False, **kwargs).logits
        return logits[:, -(width + 1):-1]

    def response_logprobs(self, inputs: dict[str, Tensor], with_entropy: bool = False
                          ) -> tuple[Tensor, Tensor | None]:
        """Logprobs ``(B, R)`` of the response tokens, and optionally their entropy."""
        width = inputs['response_mask'].shape[1]
        logits = self.response_logits(inputs['input_ids'], inputs['attention_mask'], width)
        logprobs = gather_logprobs(logits, inputs['input_ids'][:, -width:])
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = token_entropy(logits.detach())
        return logprobs, entropy

    def forward(self, inputs: dict[str, Tensor], data_samples: Any = None, mode: str = 'loss'
                ) -> dict[str, Tensor] | tuple[Tensor, Tensor | None]:
        """``mode='loss'``: policy loss and its metrics; ``mode='logprobs'``: logprobs, entropy."""
        if mode == 'logprobs':
            return self.response_logprobs(inputs, with_entropy=True)
        if mode != 'loss':
            raise ValueError(f"RLPolicy.forward supports mode='loss' or 'logprobs', got {mode!r}")
        logprobs, _ = self.response_logprobs(inputs)
        loss, metrics = self.policy_loss(logprobs, inputs['old_logprobs'], inputs['advantages'],
                                         inputs['response_mask'],
                                         num_tokens=inputs.get('num_tokens'),
                                         num_seqs=inputs.get('num_seqs'))
        return {'loss': loss, **metrics}

    def parse_losses(self, losses: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss is ``losses['loss']``; every other entry is a detached metric.

        (mmengine's default would sum every key containing "loss", which would add
        metrics such as ``loss/clipfrac`` to the objective.)
        """
        log_vars = OrderedDict((k, v.detach().float()) for k, v in losses.items())
        return losses['loss'], log_vars
