"""The policy-loss contract: a per-token surrogate, aggregated by the base class.

A policy loss is an object of :data:`~gepo_xtuner.registry.POLICY_LOSSES` that
subclasses :class:`PolicyLoss` and implements one method, :meth:`PolicyLoss.per_token`.
The base class owns everything else: input checks and broadcasting
(:func:`~gepo_xtuner.loss.aggregate.prepare_inputs`), the aggregation mode ``agg``
and its global denominators (:func:`~gepo_xtuner.loss.aggregate.aggregate`), the
metrics every loss reports, and the (empty) run state. Adding a loss::

    @POLICY_LOSSES.register_module()
    class MyLoss(PolicyLoss):
        def __init__(self, clip: float = 0.2, agg: str = 'token-mean') -> None:
            super().__init__(agg)
            self.clip = check_number('clip', clip, 0.0)   # validate when built

        def per_token(self, inp: PolicyInputs) -> TokenLoss:
            return TokenLoss(-inp.advantages * inp.ratio.clamp(max=1 + self.clip))
"""

import abc
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from gepo_xtuner.loss.aggregate import (PolicyInputs, aggregate, check_agg, flag_fractions,
                                        prepare_inputs, ratio_metrics)

__all__ = ['PolicyLoss', 'TokenLoss']


@dataclass
class TokenLoss:
    """What :meth:`PolicyLoss.per_token` returns.

    Attributes:
        loss: ``(N, T)`` per-token loss ``l_t``; padded positions are ignored.
        flags: name -> ``(N, T)`` bool, logged as ``loss/<name>``, the share of valid
            tokens where the flag is set (e.g. ``clipfrac``).
        metrics: further detached 0-dim tensors named ``area/metric``.
    """

    loss: Tensor
    flags: dict[str, Tensor] = field(default_factory=dict)
    metrics: dict[str, Tensor] = field(default_factory=dict)


class PolicyLoss(abc.ABC):
    """Base class and contract of the policy-gradient losses.

    Call::

        loss, metrics = loss_fn(logprobs, old_logprobs, advantages, mask, *,
                                num_tokens=None, num_seqs=None, norm_length=None,
                                behaviour_weights=None)

    with ``logprobs`` (differentiable), ``old_logprobs`` and ``mask`` of shape
    ``(N, T)`` and ``advantages`` ``(N,)`` or ``(N, T)``; ``old_logprobs`` and
    ``advantages`` are constants. ``old_logprobs`` are the proximal policy's
    (``pi_prox``, the trainer's recomputed logprobs): every loss's ratio is
    ``rho_t = pi_theta / pi_prox``. The result is
    ``aggregate(w_t * per_token(inp).loss, mask, agg, num_tokens, num_seqs, norm_length)``:
    ``w_t`` are ``behaviour_weights`` (``(N, T)`` constants, e.g. the truncated
    behaviour weights ``min(pi_prox / mu, C)`` of
    :class:`~gepo_xtuner.loss.behaviour.BehaviourCorrection`; None: no product at all,
    so the loss is bit for bit the uncorrected one), applied to every loss's per-token
    term before aggregation, so no loss needs code of its own for it.
    ``num_tokens`` / ``num_seqs`` override the denominators (the RL loop passes
    the whole minibatch's counts over all ranks, so micro-batches add up to the
    minibatch's loss), ``norm_length`` is Dr.GRPO's constant length. ``metrics``
    holds ``loss/pg`` (the weighted loss), ``ratio/mean|max|min``, ``loss/approx_kl``,
    one ``loss/<flag>`` per flag and the loss's own metrics, all detached 0-dim tensors;
    the weights change only ``loss/pg``.

    Contract for subclasses:

    * implement :meth:`per_token`, a pure function of its inputs (and of the
      loss's own generator, if any);
    * validate constructor arguments when built, with a message naming the
      argument and the allowed range;
    * keep any state that changes during training (e.g. a seeded generator) in
      :meth:`state_dict` / :meth:`load_state_dict`: the RL loop checkpoints it.

    Args:
        agg: aggregation mode, see :func:`~gepo_xtuner.loss.aggregate.aggregate`.
            Read by the policy model too, which aggregates the reference-KL term
            the same way.
    """

    def __init__(self, agg: str = 'token-mean') -> None:
        self.agg = check_agg(agg)

    @abc.abstractmethod
    def per_token(self, inp: PolicyInputs) -> TokenLoss:
        """The per-token loss of validated inputs (all ``(N, T)``, padding zeroed)."""

    def __call__(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
                 mask: Tensor, *, num_tokens=None, num_seqs=None, norm_length=None,
                 behaviour_weights: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """The aggregated loss and its metrics; see the class docstring."""
        inp = prepare_inputs(logprobs, old_logprobs, advantages, mask)
        out = self.per_token(inp)
        per_token = out.loss
        if behaviour_weights is not None:
            per_token = per_token * _weights(behaviour_weights, inp)
        loss = aggregate(per_token, inp.mask, self.agg, num_tokens, num_seqs, norm_length)
        metrics = ratio_metrics(inp, loss)
        metrics.update(flag_fractions(inp, **out.flags))
        metrics.update(out.metrics)
        return loss, metrics

    def state_dict(self) -> dict[str, Any]:
        """State that changes during training (none by default)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict`'s output (nothing by default)."""

    def __repr__(self) -> str:
        items = [(k, v) for k, v in vars(self).items() if k[0] != '_' and k != 'agg']
        args = ', '.join(f'{k}={v!r}' for k, v in [*items, ('agg', self.agg)])
        return f'{type(self).__name__}({args})'


def _weights(weights: Tensor, inp: PolicyInputs) -> Tensor:
    """``weights`` detached, in the compute dtype, 1 at padding (so nothing non-finite
    there reaches the product or its gradient).

    Raises:
        ValueError: ``weights`` is not shaped like the per-token loss.
    """
    if weights.shape != inp.mask.shape:
        raise ValueError(f'behaviour_weights must have shape {tuple(inp.mask.shape)} like '
                         f'logprobs, got {tuple(weights.shape)}')
    one = torch.ones((), dtype=inp.ratio.dtype, device=inp.ratio.device)
    return torch.where(inp.mask, weights.detach().to(inp.ratio.dtype), one)
