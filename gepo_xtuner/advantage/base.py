"""Advantage processors: estimators, shapers that wrap them, and their shared pieces.

An estimator (:class:`AdvantageEstimator`) turns rewards into per-response
advantages (:meth:`AdvantageProcessor.estimate`); a shaper (:class:`AdvantageShaper`)
wraps any estimator and rescales or removes its advantages
(:meth:`AdvantageProcessor.shape`, returning a :class:`Shaping`). The base class
computes group entropies once and reports the metrics. Everything is vectorised
over the flat batch with segment operations (no Python loop over groups or
responses) and runs on the device of the inputs.
"""

import abc
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..ops.segment import Segments, moments
from .batch import AdvantageInputs


@dataclass
class EntropyBand:
    """The group-entropy band a shaper compared each group's entropy ``H_g`` with.

    Attributes:
        low, high: the thresholds used this step (NaN before the band exists).
        mu, sigma: mean and population std of the group entropies the band is
            computed from (over all ranks; NaN when no group has tokens).
        num_groups: groups with tokens behind ``mu`` and ``sigma``.
    """

    low: float
    high: float
    mu: float
    sigma: float
    num_groups: int


@dataclass
class Shaping:
    """What an :class:`AdvantageShaper` did to one batch of N responses.

    The vocabulary says what happened to an advantage, not why, so that any
    shaper (entropy bands, gates, length penalties, ...) can report in it.

    Attributes:
        advantages: ``(N,)`` float64, the shaped advantages.
        damped_positive: ``(N,)`` bool, positive advantages whose magnitude was reduced.
        damped_negative: ``(N,)`` bool, negative advantages whose magnitude was reduced.
        removed: ``(N,)`` bool, responses taken out of the batch: they are in no
            minibatch and no loss denominator (their advantage is also 0).
        metrics: the shaper's own scalar metrics, named ``<shaper>/<metric>``.
        band: the group-entropy band the shaper compared groups with, if it uses one.
    """

    advantages: Tensor
    damped_positive: Tensor
    damped_negative: Tensor
    removed: Tensor
    band: EntropyBand | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    @classmethod
    def identity(cls, advantages: Tensor) -> 'Shaping':
        """No shaping: the advantages as they are, no response flagged."""
        none = torch.zeros_like(advantages, dtype=torch.bool)
        return cls(advantages, none, none, none)


@dataclass
class AdvantageOutput:
    """What a processor returns for a batch of N responses in G groups.

    Attributes:
        advantages: ``(N,)`` float32, the advantages to train on (after shaping).
        raw_advantages: ``(N,)`` float32, the estimator's, before shaping (equal to
            ``advantages`` for processors that do not shape).
        group_entropy: ``(N,)`` float64, the per-token entropy H_g of each
            response's group (NaN where the group has no tokens or no logprobs
            were given).
        damped_positive: ``(N,)`` bool, positive advantages a shaper reduced.
        damped_negative: ``(N,)`` bool, negative advantages a shaper reduced.
        metrics: scalar metrics named ``area/metric``.
        keep: ``(N,)`` bool, the responses to train on; ``None`` keeps all. Rows
            that are not kept leave the batch (e.g. AEPO's gate): they are not in any
            minibatch and not in the loss denominators.
        band: the group-entropy band of an entropy-band shaper (GEPO), else None.
    """

    advantages: Tensor
    raw_advantages: Tensor
    group_entropy: Tensor
    damped_positive: Tensor
    damped_negative: Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    keep: Tensor | None = None
    band: EntropyBand | None = None

    @property
    def shaped(self) -> Tensor:
        """``(N,)`` bool, responses whose advantage a shaper changed or removed."""
        out = self.damped_positive | self.damped_negative
        return out if self.keep is None else out | ~self.keep


@dataclass
class GroupView:
    """Per-batch group quantities shared by the base class and its subclasses.

    Attributes:
        segments: response -> group assignment.
        entropy: ``(G,)`` float64 per-token group entropy
            ``H_g = sum_i sum_t (-lp_it) / sum_i T_i``; NaN for groups with no
            tokens (or when the batch has no logprobs).
        has_tokens: ``(G,)`` bool, groups with ``sum_i T_i > 0``.
        seq_entropy: ``(N,)`` float64 mean token entropy of each response
            (full-vocabulary entropies when the batch has them, else ``-lp``);
            NaN for empty responses.
        lengths: ``(N,)`` float64 response lengths T_i (zeros without logprobs).
    """

    segments: Segments
    entropy: Tensor
    has_tokens: Tensor
    seq_entropy: Tensor
    lengths: Tensor


def response_token_sums(values: Tensor, mask: Tensor,
                        chunk_elements: int = 1 << 18) -> tuple[Tensor, Tensor]:
    """Masked row sums and row lengths of a padded ``(N, T)`` tensor.

    This is the only pass over the token dimension on the advantage path. On CPU
    it runs over blocks of rows of about ``chunk_elements`` tokens, so the masked
    temporary stays cache-sized instead of allocating (and page-faulting) a second
    ``(N, T)`` tensor; on accelerators it is a single fused reduction.

    Args:
        values: ``(N, T)`` float.
        mask: ``(N, T)`` bool or 0/1.
        chunk_elements: CPU block size in tokens.

    Returns:
        ``(sums, lengths)``, each ``(N,)`` float64. Row sums accumulate in the
        input dtype (torch's cascaded summation; relative error ~1e-7 in float32),
        which is several times faster than float64 accumulation on CPU.
    """
    if mask.dtype != torch.bool:
        mask = mask != 0
    n, t = values.shape
    rows = n if values.device.type != 'cpu' else max(1, chunk_elements // max(t, 1))
    sums = values.new_empty(n, dtype=torch.float64)
    lengths = values.new_empty(n, dtype=torch.float64)
    for start in range(0, n, rows):
        block = mask[start:start + rows]
        sums[start:start + rows] = torch.where(block, values[start:start + rows], 0).sum(1)
        lengths[start:start + rows] = block.sum(1, dtype=torch.int32)
    return sums, lengths


#: Metrics of what shaping did: shares of responses damped (positive / negative) or removed.
SHAPING_KEYS = ('shaping/frac_damped_pos', 'shaping/frac_damped_neg', 'shaping/frac_removed')
#: Where the RL loop logs ``AdvantageOutput.band`` (``low``, ``high``) of whichever shaper
#: returned one: the console line and the training-curve figure read these names, so any
#: shaper's band is shown without copying another shaper's metric names.
BAND_KEYS = ('band/low', 'band/high')


class AdvantageProcessor(abc.ABC):
    """Base class and contract of the advantage processors (:data:`~gepo_xtuner.registry.ADVANTAGES`).

    Call it on a :class:`AdvantageInputs`; it returns an :class:`AdvantageOutput`::

        out = processor(batch, state)

    One call is: :meth:`estimate` (rewards -> per-response advantages), then
    :meth:`shape` (identity unless the processor is an :class:`AdvantageShaper`),
    then the metrics. There are two kinds of extension:

    * an **estimator** (:class:`AdvantageEstimator`: GRPO, Dr.GRPO, RLOO) implements
      :meth:`estimate`;
    * a **shaper** (:class:`AdvantageShaper`: GEPO, AEPO) wraps any estimator,
      ``dict(type='GEPOAdvantage', base=dict(type='RLOOAdvantage'))``, and
      implements :meth:`shape`.

    Contract: both methods are pure tensor functions of the batch on its device
    (segment operations, no Python loop over groups; whole groups on each rank,
    any cross-rank statistic all-reduced so that every rank gets the same value);
    arguments are validated when the processor is built; anything that changes
    across steps lives in the object :meth:`init_state` returns, which the caller
    (the RL loop) owns, checkpoints (``state_dict()`` / ``load_state_dict()``) and
    passes to every call. Stateless processors return None and ignore ``state``.
    """

    #: Fewest responses per prompt that can carry a learning signal (2 for estimators
    #: that compare a response with its group: one response alone always gets 0).
    min_group_size: int = 1

    def init_state(self) -> Any:
        """A fresh state for this processor, or None if it keeps none."""
        return None

    def start_note(self, state: Any) -> str | None:
        """One line for the start of a run about how ``state`` begins (e.g. how an
        adaptive threshold is initialised), or None when there is nothing to say."""
        return None

    def __repr__(self) -> str:
        args = ', '.join(f'{k}={v!r}' for k, v in vars(self).items()
                         if k[0] != '_' and k != 'min_group_size')
        return f'{type(self).__name__}({args})'

    @abc.abstractmethod
    def estimate(self, rewards: Tensor, segments: Segments) -> Tensor:
        """Per-response advantages before any shaping.

        Args:
            rewards: ``(N,)`` float64.
            segments: response -> group (prompt) assignment.

        Returns:
            ``(N,)`` float64.
        """

    def shape(self, advantages: Tensor, groups: GroupView, batch: AdvantageInputs,
              state: Any) -> Shaping:
        """Shapes :meth:`estimate`'s ``(N,)`` float64 advantages; identity by default."""
        return Shaping.identity(advantages)

    #: The class of the state a stateful shaper needs (None: stateless); every call checks it.
    state_type: type | None = None
    #: What a shaper measures from the batch's logprobs ('' if it needs none).
    measures: str = ''

    @property
    def estimator(self) -> 'AdvantageProcessor':
        """The processor whose :meth:`estimate` gives the advantages: itself, or a
        shaper's ``base``."""
        return self

    def __call__(self, batch: AdvantageInputs, state: Any = None,
                 base_advantages: Tensor | None = None) -> AdvantageOutput:
        """Computes advantages for one step's (local) batch: the whole template.

        ``batch.validate()`` -> :meth:`estimator`'s :meth:`estimate` -> :meth:`shape`
        -> metrics; nothing else runs in between, for estimators and shapers alike.

        Args:
            batch: the responses of this step on this rank.
            state: the object returned by :meth:`init_state` (stateful processors
                update it in place; required for them).
            base_advantages: ``(N,)`` advantages another trainer's own estimator
                computed for ``batch`` (TRL's, verl's), used in place of
                :meth:`estimate`: a shaper then shapes them. None: :meth:`estimate`.

        Returns:
            The advantages, what shaping did, and the metrics.
        """
        name = type(self).__name__
        if self.state_type is not None and not isinstance(state, self.state_type):
            raise TypeError(f'{name} is stateful: create the state once with `state = '
                            'processor.init_state()` and pass it to every call, got '
                            f'{type(state).__name__}')
        if self.measures and batch.logprobs is None:
            raise ValueError(f'{name} needs the response logprobs and mask in the batch to '
                             f'measure {self.measures}')
        batch.validate()
        rewards = batch.rewards.to(torch.float64)
        groups = self._group_view(batch)
        if base_advantages is None:
            raw = self.estimator.estimate(rewards, groups.segments)
        else:
            raw = base_advantages.to(device=rewards.device, dtype=torch.float64)
            if tuple(raw.shape) != tuple(rewards.shape) or not bool(raw.isfinite().all()):
                raise ValueError(f'{name}: base_advantages must be ({len(batch)},) finite values '
                                 f'like the rewards, got shape {tuple(raw.shape)}')
        shaping = self.shape(raw, groups, batch, state)
        metrics = dict(shaping.metrics)
        metrics.update(self._metrics(rewards, raw, shaping, groups, batch))
        return AdvantageOutput(
            advantages=shaping.advantages.to(torch.float32),
            raw_advantages=raw.to(torch.float32),
            group_entropy=groups.segments.broadcast(groups.entropy),
            damped_positive=shaping.damped_positive,
            damped_negative=shaping.damped_negative,
            metrics=metrics,
            keep=~shaping.removed if bool(shaping.removed.any()) else None,
            band=shaping.band)

    # -- shared pieces ------------------------------------------------------------------
    @staticmethod
    def _group_view(batch: AdvantageInputs) -> GroupView:
        segments = Segments.from_ids(batch.group_ids)
        n = len(batch)
        f64 = dict(dtype=torch.float64, device=batch.rewards.device)
        if batch.logprobs is None:
            nan_g = torch.full((segments.num_segments, ), math.nan, **f64)
            return GroupView(segments, nan_g, torch.zeros_like(nan_g, dtype=torch.bool),
                             torch.full((n, ), math.nan, **f64), torch.zeros(n, **f64))
        logprob_sums, lengths = response_token_sums(batch.logprobs, batch.mask)
        nll = -logprob_sums
        token_sums = segments.sum(lengths)
        has_tokens = token_sums > 0
        entropy = torch.where(has_tokens, segments.sum(nll) / token_sums.clamp_min(1), math.nan)
        per_seq = nll if batch.entropies is None else response_token_sums(batch.entropies,
                                                                         batch.mask)[0]
        seq_entropy = torch.where(lengths > 0, per_seq / lengths.clamp_min(1), math.nan)
        return GroupView(segments, entropy, has_tokens, seq_entropy, lengths)

    @staticmethod
    def _metrics(rewards: Tensor, raw: Tensor, shaping: Shaping, groups: GroupView,
                 batch: AdvantageInputs) -> dict[str, float]:
        """Batch-level and per-domain metrics, gathered with one host transfer."""
        metrics: dict[str, float] = {}
        adv = shaping.advantages
        flags = torch.stack([shaping.damped_positive, shaping.damped_negative,
                             shaping.removed], 1).to(torch.float64)
        ent = groups.entropy[groups.has_tokens]
        num_ent = max(ent.numel(), 1)  # no groups with tokens -> NaN statistics below
        ent_mean = ent.sum() / num_ent if ent.numel() else ent.new_tensor(math.nan)
        ent_std = ((ent - ent_mean)**2).sum().div(num_ent).sqrt()
        zero = (adv == 0).double()  # responses that carry no gradient signal
        totals = torch.stack([
            adv.mean(), adv.std(correction=0), adv.abs().mean(), *flags.mean(0), rewards.mean(),
            ent_mean, ent_std, ent.new_tensor(ent.numel()), zero.mean()
        ]).tolist()
        keys = ('adv/mean', 'adv/std', 'adv/abs_mean', *SHAPING_KEYS, 'reward/mean',
                'entropy/group_nll_mean', 'entropy/group_nll_std', 'count/groups_with_tokens',
                'adv/frac_zero')
        metrics.update(zip(keys, totals))
        if batch.domain_ids is None:
            return metrics
        names = list(batch.domain_names)
        dom = batch.domain_ids.long()
        d = len(names)
        seg = groups.segments
        # Group g's domain: the domain of (any) one of its responses.
        group_dom = dom.new_zeros(seg.num_segments).scatter_(0, seg.index, dom)
        ent_ok = groups.has_tokens
        n, r_mean, _, _ = moments(rewards, dom, d)
        _, _, skew_raw, _ = moments(raw, dom, d)
        _, _, skew, _ = moments(adv, dom, d)
        ng, ent_mean, _, _ = moments(groups.entropy[ent_ok], group_dom[ent_ok], d)
        per_dom = rewards.new_zeros(d, 3).index_add_(0, dom, flags) / n.clamp_min(1)[:, None]
        len_sum = rewards.new_zeros(d).index_add_(0, dom, groups.lengths)
        zero_sum = rewards.new_zeros(d).index_add_(0, dom, zero)
        table = torch.stack([
            n, r_mean, skew_raw, skew, ng, ent_mean, *per_dom.T, len_sum / n.clamp_min(1),
            zero_sum / n.clamp_min(1)
        ], 1).tolist()
        keys = ('count/responses', 'reward/mean', 'adv/skew_raw', 'adv/skew', 'count/groups',
                'entropy/group_nll', *SHAPING_KEYS, 'response/length', 'adv/frac_zero')
        for name, row in zip(names, table):
            if row[0] == 0:
                continue
            for key, value in zip(keys, row):
                metrics[f'{key}/{name}'] = value
        return metrics


class AdvantageEstimator(AdvantageProcessor):
    """An advantage estimator: implements :meth:`estimate`, does not shape.

    Adding one (``A_i = r_i - min_g(r)``, say)::

        @ADVANTAGES.register_module()
        class MinBaselineAdvantage(AdvantageEstimator):
            min_group_size = 2

            def estimate(self, rewards, segments):
                return rewards - segments.broadcast(segments.amin(rewards))

    Every shaper can then wrap it: ``dict(type='GEPOAdvantage',
    base=dict(type='MinBaselineAdvantage'))``.
    """


class AdvantageShaper(AdvantageProcessor):
    """Shapes the advantages of any :class:`AdvantageEstimator` (``base``).

    The paper's claim that GEPO "can be directly incorporated into existing
    group-based policy optimization methods" is this composition: the estimator
    decides the advantages, the shaper rescales or removes them.

    Args:
        base: the estimator, a config (``dict(type='RLOOAdvantage')``) or an
            instance; None: :class:`~gepo_xtuner.advantage.grpo.GRPOAdvantage`
            with ``default_eps``.
        default_eps: GRPO's std guard when ``base`` is None.

    Raises:
        TypeError: ``base`` is a shaper, or not an advantage processor.
    """

    def __init__(self, base: dict | AdvantageEstimator | None = None,
                 default_eps: float = 1e-8) -> None:
        from ..registry import ADVANTAGES  # registry -> this package at lookup time
        if base is None:
            base = dict(type='GRPOAdvantage', eps=default_eps)
        estimator = ADVANTAGES.build(base) if isinstance(base, dict) else base
        if not isinstance(estimator, AdvantageEstimator):
            raise TypeError(
                f'{type(self).__name__}(base=...) needs an advantage estimator '
                "(dict(type='GRPOAdvantage'), 'RLOOAdvantage', 'DrGRPOAdvantage' or your own "
                f'AdvantageEstimator), got {type(estimator).__name__}')
        self.base = estimator
        self.min_group_size = estimator.min_group_size

    @property
    def estimator(self) -> AdvantageProcessor:
        return self.base

    def estimate(self, rewards: Tensor, segments: Segments) -> Tensor:
        """The base estimator's advantages (what :meth:`__call__` uses)."""
        return self.base.estimate(rewards, segments)

    @abc.abstractmethod
    def shape(self, advantages: Tensor, groups: GroupView, batch: AdvantageInputs,
              state: Any) -> Shaping:
        """Shapes the base estimator's ``(N,)`` float64 advantages.

        Args:
            advantages: ``(N,)`` float64, :meth:`estimate`'s output.
            groups: group entropies and lengths of the batch.
            batch: the step's responses.
            state: this shaper's :meth:`init_state` object.
        """
