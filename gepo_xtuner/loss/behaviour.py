"""Behaviour-policy correction for overlapped (stale) rollouts.

Three policies meet once generation runs ahead of training:

- ``mu``, the behaviour policy: the weights the rollout engine sampled with (its per-token
  logprobs come back with the samples, ``ResponseBatch.rollout_logprobs``);
- ``pi_prox``, the proximal policy: the trainer's weights when the batch is trained (its
  logprobs are the recomputed old logprobs, ``engine.update.old_logprobs``);
- ``pi_theta``, the policy being updated.

Every policy loss takes its ratio against ``pi_prox``: ``r_t = pi_theta / pi_prox`` (PPO's
clip, CISPO's clipped weight, Clip-Cov / KL-Cov alike). The behaviour weight of a token is
the constant (no gradient)::

    w_t = pi_prox(y_t) / mu(y_t) = exp(clamp(d_t, -20, 20)),   d_t = logp_prox_t - logp_mu_t

Response ``i`` with valid tokens ``T_i`` (``n_i = |T_i|``) has two sequence-level weights,
one constant for all its tokens::

    W_i^seq = exp(clamp(sum_{t in T_i} d_t, -20, 20))        = prod_t w_t   (before clamps)
    W_i^geo = exp(clamp(sum_{t in T_i} d_t / n_i, -20, 20))  = (prod_t w_t)^(1 / n_i)

(1 for a response without valid tokens). A correction mode
(``train_cfg.behaviour_correction``) with a cap ``C > 1`` (``train_cfg.behaviour_cap``)
turns them into the loss's weights; ``l_t`` is a token's policy loss:

- ``'none'``: nothing is computed; the loss is the uncorrected one.
- ``'truncate'`` (decoupled PPO, Hilton et al. 2021, arXiv:2110.00641; truncated
  importance sampling, TRL's ``vllm_importance_sampling_mode='token_truncate'``):
  ``l_t`` becomes ``min(w_t, C) * l_t``; the denominators are unchanged.
- ``'mask'`` (masked importance sampling / token rejection, verl's and XTuner's
  ``rollout_is_mode='mask'`` at ``rollout_is_level='token'``): tokens with ``w_t`` outside
  ``[1/C, C]`` leave the loss and its denominators (they count as padding); kept tokens
  weigh 1.
- ``'sequence_truncate'`` (TRL's ``'sequence_truncate'``; verl / XTuner
  ``rollout_is_level='sequence'``, the unbiased sequence-level importance weight of the
  whole response, Liu, Li et al. 2025, "When Speed Kills Stability"): every token of
  response ``i`` gets ``min(W_i^seq, C) * l_t``; the denominators are unchanged.
- ``'sequence_mask'`` (TRL's ``'sequence_mask'``, which drops only ``W > C``; here the band
  is two-sided like ``'mask'``): a response with ``W_i^seq`` outside ``[1/C, C]`` leaves
  the loss and its denominators whole (every token counts as padding, and the response
  leaves the sequence count as an empty one does); kept responses weigh 1.
- ``'geometric_truncate'`` / ``'geometric_mask'``: the same with the geometric mean
  ``W_i^geo``, the length-normalised sequence ratio of GSPO (Zheng et al. 2025,
  arXiv:2507.18071) and XTuner / verl ``rollout_is_level='geometric'``: it does not grow
  with the response's length as ``W^seq`` does, so a band ``[1/C, C]`` means the same at
  every length.

Independently of the mode, a veto ``v`` in ``(0, 1)`` (``train_cfg.behaviour_veto``; verl's
``rollout_is_veto_threshold``, the lower side of XTuner's ``(upper, lower)`` one) drops every
response holding a token with ``w_t < v`` (``d_t < log v``, the unclamped log-ratio) from the
loss and the denominators, as ``'sequence_mask'`` drops a response: a token the trainer finds
far less likely than the sampler did marks a response the weights cannot repair. It combines
with every mode, ``'none'`` included (then only the veto acts, as verl applies its veto to
the response mask even when the weights are not applied; XTuner runs its veto only with a
correction on); off (None), ``'none'`` computes nothing.

With ``mu = pi_prox`` (no staleness, no engine/trainer mismatch) every ``d_t = 0``, so
``w_t = W_i = exp(0) = 1`` exactly, ``min(1, C) = 1`` and ``1 * l_t = l_t`` bit for bit:
every truncate mode gives the uncorrected loss, every mask mode keeps everything, and no
veto ``v < 1`` fires.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from gepo_xtuner.loss.aggregate import LOG_RATIO_CLAMP, check_number

__all__ = ['BEHAVIOUR_CORRECTIONS', 'BehaviourCorrection', 'behaviour_weights',
           'check_behaviour_correction', 'correction_level', 'sequence_behaviour_weights']

BEHAVIOUR_CORRECTIONS = ('none', 'truncate', 'mask', 'sequence_truncate', 'sequence_mask',
                         'geometric_truncate', 'geometric_mask')
"""Valid values of ``train_cfg.behaviour_correction``."""


def correction_level(mode: str) -> tuple[str, str]:
    """``(level, action)`` of a valid mode: level ``'token'``, ``'sequence'`` or
    ``'geometric'``; action ``'none'``, ``'truncate'`` or ``'mask'``."""
    level, _, action = mode.rpartition('_')
    return level or 'token', action


def check_behaviour_correction(mode: str, cap: float, veto: float | None = None) -> float:
    """Validates a correction mode, its cap and the veto; returns the cap as ``float``.

    Raises:
        ValueError: naming ``train_cfg.behaviour_correction`` and its allowed values,
            ``train_cfg.behaviour_cap`` and its range ``(1, inf)``, or
            ``train_cfg.behaviour_veto`` and its range ``(0, 1)``.
    """
    if mode not in BEHAVIOUR_CORRECTIONS:
        raise ValueError(f'train_cfg.behaviour_correction must be one of '
                         f'{list(BEHAVIOUR_CORRECTIONS)}, got {mode!r}')
    if veto is not None:
        # v >= 1 would veto responses the weights call on-policy (w_t = 1); v <= 0 never fires
        check_number('train_cfg.behaviour_veto', veto, 0.0, 1.0, low_open=True, high_open=True)
    return check_number('train_cfg.behaviour_cap', cap, 1.0, math.inf, low_open=True,
                        high_open=True)


def _log_ratios(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor
                ) -> tuple[Tensor, Tensor]:
    """``(d, valid)``: ``(N, R)`` ``d = old - rollout`` (detached, float32 or wider), 0 at
    padding whatever the inputs hold there, and ``mask`` as bool.

    Raises:
        ValueError: on mismatched shapes.
    """
    if not old_logprobs.shape == rollout_logprobs.shape == mask.shape:
        raise ValueError('old_logprobs, rollout_logprobs and mask must have one shape (N, R), '
                         f'got {tuple(old_logprobs.shape)}, {tuple(rollout_logprobs.shape)}, '
                         f'{tuple(mask.shape)}')
    dtype = torch.promote_types(torch.promote_types(old_logprobs.dtype, rollout_logprobs.dtype),
                                torch.float32)
    valid = mask.bool()
    log_w = (old_logprobs.detach().to(dtype) - rollout_logprobs.detach().to(dtype))
    return torch.where(valid, log_w, torch.zeros((), dtype=dtype, device=log_w.device)), valid


def behaviour_weights(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-token behaviour weights ``w = pi_prox / mu``, before any cap.

    ``w_t = exp(clamp(old_logprobs_t - rollout_logprobs_t, -20, 20))`` at valid tokens
    (the clamp only guards ``exp``; ``w`` lies in about ``[2e-9, 4.9e8]``), exactly 1 at
    padding (whatever the inputs hold there).

    Args:
        old_logprobs: ``(N, R)`` proximal-policy logprobs (the trainer's recomputed ones).
        rollout_logprobs: ``(N, R)`` behaviour-policy logprobs (the rollout engine's).
        mask: ``(N, R)`` bool, valid response tokens.

    Returns:
        ``(N, R)`` float32 (or wider, following the inputs), detached.

    Raises:
        ValueError: on mismatched shapes.
    """
    log_w, _ = _log_ratios(old_logprobs, rollout_logprobs, mask)
    return torch.exp(log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def sequence_behaviour_weights(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor,
                               level: str) -> Tensor:
    """Per-response behaviour weights, before any cap.

    With ``d_t = old_logprobs_t - rollout_logprobs_t`` over the ``n_i`` valid tokens of
    response ``i``: ``level='sequence'``: ``W_i = exp(clamp(sum_t d_t, -20, 20))``, the
    product of the token weights (the importance weight ``pi_prox(y) / mu(y)`` of the whole
    response); ``level='geometric'``: ``W_i = exp(clamp(sum_t d_t / n_i, -20, 20))``, their
    geometric mean. The log-ratios are summed unclamped (a clamp per token would bias the
    product); only the result is clamped, to guard ``exp``. 1 for a response without valid
    tokens.

    Args:
        old_logprobs: ``(N, R)`` proximal-policy logprobs.
        rollout_logprobs: ``(N, R)`` behaviour-policy logprobs.
        mask: ``(N, R)`` bool, valid response tokens.
        level: ``'sequence'`` or ``'geometric'``.

    Returns:
        ``(N,)`` float32 (or wider, following the inputs), detached.

    Raises:
        ValueError: on mismatched shapes or an unknown level.
    """
    if level not in ('sequence', 'geometric'):
        raise ValueError(f"level must be 'sequence' or 'geometric', got {level!r}")
    log_w, valid = _log_ratios(old_logprobs, rollout_logprobs, mask)
    total = log_w.sum(1)
    if level == 'geometric':
        total = total / valid.sum(1).clamp_min(1).to(total.dtype)
    return torch.exp(total.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


@dataclass(frozen=True)
class BehaviourCorrection:
    """The behaviour correction of one batch of ``N`` responses of width ``R``.

    Build it with :meth:`of`. Constant across the PPO epochs of a batch: neither
    ``pi_prox`` nor ``mu`` changes while it is trained.

    Attributes:
        mode: one of :data:`BEHAVIOUR_CORRECTIONS` (``'none'`` only with a veto).
        cap: ``C > 1``.
        weights: ``(N, R)`` token weights ``w = pi_prox / mu`` before the cap, 1 at padding
            (computed in every mode: the ``offpolicy/weight_*`` metrics and the veto read it).
        mask: ``(N, R)`` bool, the valid response tokens ``w`` was computed on.
        outside: ``(N, R)`` bool, valid tokens the cap acts on: ``w > C`` (truncate) or
            ``w`` outside ``[1/C, C]`` (mask); for the sequence-level modes every valid
            token of a response whose ``W`` is above ``C`` (truncate) or outside
            ``[1/C, C]`` (mask); none for ``'none'``.
        seq_weights: ``(N,)`` ``W^seq`` or ``W^geo`` before the cap (1 for a response
            without valid tokens), None for the token-level modes.
        veto: ``v`` in ``(0, 1)`` or None (off).
        vetoed: ``(N,)`` bool, responses with a valid token ``d_t < log v`` (all False
            with the veto off).
    """

    mode: str
    cap: float
    weights: Tensor
    mask: Tensor
    outside: Tensor
    seq_weights: Tensor | None = None
    veto: float | None = None
    vetoed: Tensor | None = None

    @classmethod
    def of(cls, old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, mode: str,
           cap: float, veto: float | None = None) -> 'BehaviourCorrection | None':
        """The correction of a batch, or None for ``mode='none'`` without a veto (nothing
        is computed).

        Args:
            old_logprobs: ``(N, R)`` proximal-policy logprobs ``log pi_prox``.
            rollout_logprobs: ``(N, R)`` behaviour-policy logprobs ``log mu``.
            mask: ``(N, R)`` bool, valid response tokens.
            mode: one of :data:`BEHAVIOUR_CORRECTIONS`.
            cap: ``C > 1``.
            veto: ``v`` in ``(0, 1)``, or None (off).

        Raises:
            ValueError: an unknown mode, a cap not in ``(1, inf)``, a veto not in
                ``(0, 1)``, mismatched shapes.
        """
        cap = check_behaviour_correction(mode, cap, veto)
        if mode == 'none' and veto is None:
            return None
        log_w, valid = _log_ratios(old_logprobs, rollout_logprobs, mask)
        w = torch.exp(log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        level, action = correction_level(mode)
        seq = None
        if level == 'token':
            scored = w  # what the cap compares, per token
        else:
            seq = sequence_behaviour_weights(old_logprobs, rollout_logprobs, valid, level)
            scored = seq[:, None]
        if action == 'truncate':
            outside = valid & (scored > cap)
        elif action == 'mask':
            outside = valid & ((scored < 1.0 / cap) | (scored > cap))
        else:
            outside = torch.zeros_like(valid)
        vetoed = torch.zeros(valid.shape[0], dtype=torch.bool, device=valid.device)
        if veto is not None:
            # the unclamped log-ratio: a clamp at -20 would hide tokens below exp(-20)
            vetoed = (valid & (log_w < math.log(veto))).any(1)
        return cls(mode, cap, w, valid, outside, seq, veto, vetoed)

    @property
    def level(self) -> str:
        """``'token'``, ``'sequence'`` or ``'geometric'``."""
        return correction_level(self.mode)[0]

    @property
    def action(self) -> str:
        """``'none'``, ``'truncate'`` or ``'mask'``."""
        return correction_level(self.mode)[1]

    @property
    def loss_weights(self) -> Tensor | None:
        """``(N, R)`` weights that multiply each token's loss: ``min(w_t, C)``
        (``'truncate'``) or ``min(W_i, C)`` on every token of response ``i``
        (``'sequence_truncate'``, ``'geometric_truncate'``; 1 at padding); else None."""
        if self.action != 'truncate':
            return None
        if self.seq_weights is None:
            return self.weights.clamp(max=self.cap)
        capped = self.seq_weights.clamp(max=self.cap)[:, None].expand_as(self.weights)
        return torch.where(self.mask, capped, torch.ones_like(self.weights))

    @property
    def loss_mask(self) -> Tensor | None:
        """``(N, R)`` bool, the tokens the loss and its denominators count: valid tokens
        less those outside the band (mask modes: tokens with ``w`` outside ``[1/C, C]``, or
        every token of a response whose ``W`` is) less every token of a vetoed response;
        None when nothing is dropped by construction (truncate modes and ``'none'``
        without a veto: every valid token counts)."""
        if self.action != 'mask' and self.veto is None:
            return None
        kept = self.mask & ~self.outside if self.action == 'mask' else self.mask
        return kept & ~self.vetoed[:, None] if self.veto is not None else kept

    def metric_sums(self, rows: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Sums for the ``offpolicy/*`` metrics over ``rows`` (default all), to all-reduce.

        Returns:
            ``(sums, max)``: float64 ``(7,)`` ``[sum of w, tokens outside, valid tokens,
            sum of W, responses outside, responses with a valid token, responses vetoed]``
            (the response figures over responses with a valid token; ``W`` terms 0 for the
            token-level modes) and float64 ``(2,)`` ``[largest w, largest W]`` (``-inf``
            where there is none).
        """
        w, valid, outside, vetoed = self.weights, self.mask, self.outside, self.vetoed
        seq = self.seq_weights
        if rows is not None:
            w, valid, outside, vetoed = w[rows], valid[rows], outside[rows], vetoed[rows]
            seq = None if seq is None else seq[rows]
        w = w.to(torch.float64)
        present = valid.any(1)
        seq = torch.zeros(present.shape, dtype=torch.float64, device=w.device) if seq is None \
            else seq.to(torch.float64)
        sums = torch.stack([torch.where(valid, w, 0.0).sum(), outside.sum().to(torch.float64),
                            valid.sum().to(torch.float64),
                            torch.where(present, seq, 0.0).sum(),
                            (outside.any(1) & present).sum().to(torch.float64),
                            present.sum().to(torch.float64),
                            (vetoed & present).sum().to(torch.float64)])
        none = torch.tensor(-math.inf, dtype=torch.float64, device=w.device)
        top_w = torch.where(valid, w, -math.inf).amax() if w.numel() else none
        top_seq = (torch.where(present, seq, -math.inf).amax() if present.numel()
                   and self.seq_weights is not None else none)
        return sums, torch.stack([top_w, top_seq])

    @staticmethod
    def metrics(mode: str, sums: Tensor, top: Tensor, veto: float | None = None
                ) -> dict[str, float]:
        """The ``offpolicy/*`` metrics from :meth:`metric_sums` reduced over ranks (sum,
        max).

        Every correction: ``offpolicy/weight_mean`` (mean ``w`` over valid tokens, before
        the cap) and ``offpolicy/weight_max``. Token modes: ``offpolicy/frac_truncated``
        (share of valid tokens with ``w > C``, truncate) or ``offpolicy/frac_masked``
        (share outside ``[1/C, C]``, mask). Sequence / geometric modes:
        ``offpolicy/seq_weight_mean`` and ``offpolicy/seq_weight_max`` (of ``W`` over the
        responses with a valid token, before the cap) and ``offpolicy/frac_seq_truncated``
        (share of those responses with ``W > C``) or ``offpolicy/frac_seq_masked`` (share
        outside ``[1/C, C]``). With a veto: ``offpolicy/frac_vetoed`` (share of those
        responses vetoed, whatever the mode did to them). Left out where no token was
        valid.
        """
        total, outside, tokens, seq_total, seqs_outside, seqs, vetoed = (float(v) for v in sums)
        if tokens <= 0:
            return {}
        level, action = correction_level(mode)
        out = {'offpolicy/weight_mean': total / tokens, 'offpolicy/weight_max': float(top[0])}
        if level == 'token' and action != 'none':
            frac = 'offpolicy/frac_truncated' if action == 'truncate' else 'offpolicy/frac_masked'
            out[frac] = outside / tokens
        elif level != 'token':
            out['offpolicy/seq_weight_mean'] = seq_total / seqs
            out['offpolicy/seq_weight_max'] = float(top[1])
            out[f'offpolicy/frac_seq_{"truncated" if action == "truncate" else "masked"}'] = \
                seqs_outside / seqs
        if veto is not None:
            out['offpolicy/frac_vetoed'] = vetoed / seqs
        return out
