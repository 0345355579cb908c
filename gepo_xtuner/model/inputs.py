"""What the trainer hands the policy for one micro-batch: a typed contract, not a dict."""

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor

from ..ops.multimodal import MMInputs, mm_to

__all__ = ['LossInputs']


@dataclass
class LossInputs:
    """One micro-batch of ``[left-padded prompt | right-padded response]`` rows.

    :meth:`~gepo_xtuner.model.RLPolicy.forward` reads it in both modes: ``'logprobs'``
    (scoring: the first three fields, ``temperature`` and ``mm_inputs``) and ``'loss'``
    (all of them). The RL update builds it with
    :func:`~gepo_xtuner.engine.step.batching.loss_inputs`. ``B`` rows, prompt width ``P``,
    response width ``R``.

    Attributes:
        input_ids: ``(B, P + R)`` long.
        attention_mask: ``(B, P + R)`` 0/1.
        response_mask: ``(B, R)`` bool, real response tokens.
        old_logprobs: ``(B, R)`` old-policy logprobs (loss mode; a constant): those of the
            proximal policy ``pi_prox`` (the trainer's weights when the batch is trained,
            recomputed by :func:`~gepo_xtuner.engine.step.update.old_logprobs`); every loss's
            ratio is ``pi_theta / pi_prox``.
        advantages: ``(B,)`` or ``(B, R)`` (loss mode; a constant).
        num_tokens: 0-dim, valid tokens of the WHOLE minibatch over all ranks: the
            token-mean denominator, so micro-batches add up to the minibatch's loss.
            None: this micro-batch's own count.
        num_seqs: 0-dim, non-empty responses of the whole minibatch over all ranks:
            the seq-mean denominator. None: this micro-batch's own count.
        norm_length: ``L``, the constant length of the ``'seq-mean-token-sum-norm'``
            aggregation (Dr.GRPO); ignored by the other modes. None: the padded width
            ``R`` (the RL loop always passes ``train_cfg.norm_length``).
        temperature: ``tau``: logprobs and entropies are those of
            ``softmax(logits / tau)``, the distribution the responses were sampled from.
        mm_inputs: the rows' multimodal tensors as the processor names them
            (``pixel_values``, ``image_grid_thw``, ...), concatenated along dim 0 in
            row order (:mod:`gepo_xtuner.ops.multimodal`); None for text-only rows.
        behaviour_weights: ``(B, R)`` float constants that multiply each token's
            policy-gradient loss before aggregation: ``min(pi_prox / mu, C)`` per token
            (``behaviour_correction='truncate'``) or the response's capped sequence weight
            on each of its tokens (``'sequence_truncate'``, ``'geometric_truncate'``;
            :class:`~gepo_xtuner.loss.behaviour.BehaviourCorrection`); padding is ignored.
            None: no weighting.
        loss_mask: ``(B, R)`` bool, the response tokens the loss counts, a subset of
            ``response_mask`` (``behaviour_correction='mask'`` leaves out the tokens whose
            behaviour weight ``pi_prox / mu`` lies outside ``[1/C, C]``, the sequence-level
            mask modes and ``behaviour_veto`` whole responses); ``num_tokens``
            and ``num_seqs`` must count these tokens and the rows that keep one. Scoring
            still reads ``response_mask``. None: ``response_mask``.
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    old_logprobs: Tensor | None = None
    advantages: Tensor | None = None
    num_tokens: Tensor | float | None = None
    num_seqs: Tensor | float | None = None
    norm_length: float | None = None
    temperature: float | None = None
    mm_inputs: MMInputs | None = None
    behaviour_weights: Tensor | None = None
    loss_mask: Tensor | None = None

    @classmethod
    def of(cls, inputs: 'LossInputs | Mapping[str, Any]') -> 'LossInputs':
        """``inputs`` itself, or a mapping of the field names (mmengine's convention for
        model inputs; tests and tools write them by hand).

        Raises:
            TypeError: a key that is not a field, naming the fields.
        """
        if isinstance(inputs, cls):
            return inputs
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(inputs) - names)
        if unknown:
            raise TypeError(f'LossInputs has no field {unknown}; its fields are {sorted(names)}')
        return cls(**inputs)

    def to(self, device: torch.device | str) -> 'LossInputs':
        """The same inputs with every tensor on ``device`` (multimodal tensors too)."""
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self)
                 if isinstance(getattr(self, f.name), Tensor)}
        if self.mm_inputs is not None:
            moved['mm_inputs'] = mm_to(self.mm_inputs, device)
        return replace(self, **moved)

    def without_tokens(self) -> 'LossInputs':
        """The same rows with an all-zero response mask (and loss mask): loss 0, gradient 0.
        A rank with nothing to train runs it so that it meets the others' gradient
        reductions."""
        if self.loss_mask is None:
            return replace(self, response_mask=torch.zeros_like(self.response_mask))
        return replace(self, response_mask=torch.zeros_like(self.response_mask),
                       loss_mask=torch.zeros_like(self.loss_mask))

    @property
    def counted_mask(self) -> Tensor:
        """``(B, R)`` bool, the tokens the loss counts: ``loss_mask``, else
        ``response_mask``."""
        return self.response_mask if self.loss_mask is None else self.loss_mask
