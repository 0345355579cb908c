"""The trainer side of one RL step, as plain functions with explicit arguments.

Two calls make it, both used by :class:`~gepo_xtuner.engine.loop.RLTrainLoop`, the testbed's
:func:`~gepo_xtuner.testbed.rl_step.rl_step`, ``benchmarks/bench_rl_step.py`` and the GPU
tests alike::

    old, entropy = old_logprobs(policy, batch, settings)   # one no-grad pass
    ...                                                    # advantages from them
    metrics = ppo_update(model, optim_wrapper, batch, old, advantages, keep, settings)

:func:`ppo_update` reads top to bottom: ``ppo_epochs`` passes over shuffled minibatches,
each split into micro-batches by a token budget and handed to
:func:`~gepo_xtuner.engine.step.optim_step.optimizer_step` (which keeps the ranks in lockstep).
:class:`MicroBatchStats` reduces the micro-batches' loss outputs to the step's metrics.
"""

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from torch import Tensor

from ...loss.behaviour import BehaviourCorrection, check_behaviour_correction
from ...model.inputs import LossInputs
from ...ops.distributed import all_reduce, dist_world_size
from ...rollout import SamplingParams
from .batching import (KEPT_ROWS, ResponseBatch, kept_minibatches, loss_inputs, micro_batches,
                       minibatches)
from .optim_step import optimizer_step, prime_gradient_buckets

__all__ = ['UpdateSettings', 'old_logprobs', 'ppo_update', 'MicroBatchStats', 'entropy_metrics',
           'behaviour_refusal', 'resolve_behaviour_correction', 'NoSignalWatch',
           'check_training_sampling']


@dataclass(frozen=True)
class UpdateSettings:
    """How the trainer side of a step runs; ``train_cfg`` fields of the same names.

    Attributes:
        minibatch_responses_per_rank: responses per optimizer step on one rank (the
            paper's minibatch of 32 prompts x K=16 is 512 responses over all ranks).
            Optimizer steps per pass: ``ceil(N / minibatch_responses_per_rank)``, or fewer
            on steps where the advantage processor removed rows (``kept_rows``).
        ppo_epochs: passes over each rollout batch.
        max_tokens_per_micro_batch: token budget of one forward/backward: a
            minibatch is split into the fewest micro-batches whose padded block
            (``rows x (longest prompt + longest response)``) fits, balanced
            (:func:`~gepo_xtuner.engine.step.batching.micro_batches`); when the policy
            packs sequences (``model.packing``, text-only steps) the budget counts
            real tokens instead, ``sum (prompt + response)``; None: one
            micro-batch per minibatch.
        logprob_max_tokens_per_micro_batch: the same budget for the no-grad
            old-logprob pass; None: ``max_tokens_per_micro_batch``.
        kept_rows: how the rows are trained when the advantage processor removed some
            (AEPO while its gate is on): ``'full_minibatches'`` (default, as AEPO's
            authors ran it on verl: the kept rows in minibatches of
            ``minibatch_responses_per_rank``, so fewer optimizer steps of full size, see
            :func:`~gepo_xtuner.engine.step.batching.kept_minibatches`) or ``'spread'`` (the
            step count of the full batch, kept rows spread over it: more, smaller
            optimizer steps).
        temperature: the sampling temperature: every logprob is one of
            ``softmax(logits / temperature)``; derived, not a ``train_cfg`` key
            (:class:`~gepo_xtuner.engine.train_cfg.TrainCfg` sets ``sampling.temperature``).
        norm_length: ``L``, the constant length the ``'seq-mean-token-sum-norm'`` loss
            aggregation (Dr.GRPO) divides by; other aggregations ignore it. From a config,
            by default ``sampling.max_new_tokens`` (the generation cap, as Dr.GRPO's
            authors ran it). None (direct use only): the padded width.
        behaviour_correction: how the loss corrects for rollouts sampled by a behaviour
            policy ``mu`` other than the proximal policy ``pi_prox`` whose logprobs are
            the recomputed old logprobs (overlapped rollouts with bounded staleness,
            engine/trainer mismatch). Per token ``w_t = pi_prox / mu =
            exp(d_t)``, ``d_t = old_logprobs_t - rollout_logprobs_t``; per response ``i``
            (valid tokens ``T_i``, ``n_i`` of them) ``W_i^seq = exp(sum_{T_i} d_t)`` (the
            product of its ``w_t``) and ``W_i^geo = exp(sum_{T_i} d_t / n_i)`` (their
            geometric mean); all constants (exponents clamped to ``[-20, 20]``); the ratio
            of every loss stays ``pi_theta / pi_prox`` (PPO clips it, CISPO clips it as its
            weight, both against ``pi_prox``). One of ``'none'`` (default: nothing is
            computed, the update is bit for bit the uncorrected one), ``'truncate'``
            (decoupled PPO, Hilton et al. 2021 / truncated importance sampling, TRL's
            ``token_truncate``: the per-token loss becomes ``min(w_t, C) * l_t``),
            ``'mask'`` (token rejection, verl / XTuner ``rollout_is`` token level: tokens
            with ``w_t`` outside ``[1/C, C]`` leave the loss and the token-mean / seq-mean
            denominators over the whole minibatch and all ranks; a response left with no
            token leaves the sequence count, as an empty one; kept tokens weigh 1),
            ``'sequence_truncate'`` (TRL's ``vllm_importance_sampling_mode``
            ``sequence_truncate``: every token of response ``i`` gets
            ``min(W_i^seq, C) * l_t``), ``'sequence_mask'`` (TRL's ``sequence_mask``,
            two-sided here: a response with ``W_i^seq`` outside ``[1/C, C]`` leaves the
            loss and the denominators whole, like a response all of whose tokens
            ``'mask'`` dropped), ``'geometric_truncate'`` / ``'geometric_mask'`` (the same
            with ``W_i^geo``, the length-normalised ratio of GSPO, Zheng et al. 2025, and
            of verl / XTuner's ``rollout_is_level='geometric'``; unlike ``W^seq`` it does not
            drift away from 1 with the response length). See
            :mod:`gepo_xtuner.loss.behaviour`. With ``mu = pi_prox``, ``w_t = W_i = 1``
            exactly.
        behaviour_cap: ``C > 1``, the cap of the truncate modes and the band ``[1/C, C]`` of
            the mask modes; ignored by ``'none'``.
        behaviour_veto: ``v`` in ``(0, 1)``, or None (default: off). A response holding any
            valid token with ``w_t < v`` leaves the loss and the token-mean / seq-mean
            denominators whole, as ``'sequence_mask'`` drops a response (verl's
            ``rollout_is_veto_threshold``, ``1e-4`` in its examples; XTuner's takes an
            ``(upper, lower)`` pair, this is its lower side; such a token marks a sample the
            weights cannot repair, e.g. one the trainer's weights would almost never draw).
            Applied on top of any ``behaviour_correction``, ``'none'`` included (then the
            veto is the only correction, no weights, as verl rejects with its veto even
            when it does not apply the weights; XTuner runs its veto only with a correction
            on); ``offpolicy/frac_vetoed`` logs the share of responses it dropped.
    """

    minibatch_responses_per_rank: int = 32
    ppo_epochs: int = 1
    max_tokens_per_micro_batch: int | None = None
    logprob_max_tokens_per_micro_batch: int | None = None
    kept_rows: str = 'full_minibatches'
    temperature: float = field(default=1.0, metadata={'key': False})
    norm_length: float | None = None
    behaviour_correction: str = field(default='none', metadata={'key': False})
    behaviour_cap: float = 2.0
    behaviour_veto: float | None = None

    def __post_init__(self) -> None:
        if min(self.minibatch_responses_per_rank, self.ppo_epochs) < 1:
            raise ValueError('train_cfg.minibatch_responses_per_rank and train_cfg.ppo_epochs '
                             f'must be >= 1, got {self.minibatch_responses_per_rank}, '
                             f'{self.ppo_epochs}')
        for name in ('max_tokens_per_micro_batch', 'logprob_max_tokens_per_micro_batch'):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise ValueError(f'train_cfg.{name} must be an int >= 1 or None, got {value!r}')
        if self.kept_rows not in KEPT_ROWS:
            raise ValueError(f'train_cfg.kept_rows must be one of {list(KEPT_ROWS)}, got '
                             f'{self.kept_rows!r}')
        if self.norm_length is not None and not self.norm_length > 0:
            raise ValueError(f'train_cfg.norm_length must be > 0 or None, got '
                             f'{self.norm_length!r}')
        check_behaviour_correction(self.behaviour_correction, self.behaviour_cap,
                                   self.behaviour_veto)

    @property
    def logprob_budget(self) -> int | None:
        """The old-logprob pass's token budget per micro-batch."""
        return self.logprob_max_tokens_per_micro_batch or self.max_tokens_per_micro_batch


def _unwrapped(model: torch.nn.Module) -> Any:
    return model.module if is_model_wrapper(model) else model


def _packs(policy: Any, batch: ResponseBatch) -> bool:
    """Whether micro-batches of ``batch`` run packed (the budget counts real tokens)."""
    return getattr(policy, 'packs', False) and batch.mm_inputs is None


@torch.no_grad()
def old_logprobs(policy: Any, batch: ResponseBatch, settings: UpdateSettings
                 ) -> tuple[Tensor, Tensor]:
    """Old-policy logprobs and full-vocabulary entropies of ``batch``.

    One no-grad forward per micro-batch of ``settings.logprob_budget`` tokens.

    Args:
        policy: the :class:`~gepo_xtuner.model.RLPolicy` (or a wrapper of it).
        batch: the step's N responses (on the CPU; micro-batches are moved to the
            policy's device).
        settings: temperature and token budget.

    Returns:
        ``(logprobs, entropies)``, each ``(N, R)`` float32 on the CPU, 0 at padding.
    """
    policy = _unwrapped(policy)
    device = next(policy.parameters()).device
    logprobs = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
    entropies = torch.zeros_like(logprobs)
    prompt_len, response_len = batch.lengths()
    for rows in micro_batches(torch.arange(len(batch)), prompt_len, response_len,
                              settings.logprob_budget, _packs(policy, batch)):
        part = batch.rows(rows)
        inputs = LossInputs(part.input_ids, part.attention_mask, part.response_mask,
                            temperature=settings.temperature,
                            mm_inputs=None if part.mm_inputs is None
                            else part.multimodal_inputs()).to(device)
        lp, ent = policy(inputs=inputs, mode='logprobs')
        width = part.response_width
        logprobs[rows, :width] = lp.float().cpu()
        entropies[rows, :width] = ent.float().cpu()
    return logprobs, entropies


def ppo_update(model: torch.nn.Module, optim_wrapper: Any, batch: ResponseBatch,
               old_logprobs: Tensor, advantages: Tensor, keep: Tensor | None,
               settings: UpdateSettings, *, prime_buckets: bool = False) -> dict[str, float]:
    """``ppo_epochs`` passes of shuffled minibatches, one optimizer step each.

    Every micro-batch's loss is divided by its minibatch's token (or response) count
    over ALL ranks (one all-reduce per minibatch) and multiplied by the world size
    before backward (data-parallel wrappers average gradients), so M micro-batches on
    P ranks give the gradient of one big batch.

    Rows an advantage processor did not keep (``keep`` False) are in no minibatch and
    no denominator. With ``settings.behaviour_correction`` the rollout's logprobs
    (``batch.rollout_logprobs``, the behaviour policy ``mu``) and ``old_logprobs``
    (``pi_prox``) give each token its weight ``w = pi_prox / mu``
    (:class:`~gepo_xtuner.loss.behaviour.BehaviourCorrection`), and each response its
    product ``W^seq`` or geometric mean ``W^geo``: the truncate modes pass ``min(w, C)``
    (``'truncate'``) or ``min(W, C)`` on every token of the response
    (``'sequence_truncate'``, ``'geometric_truncate'``) to the loss; the mask modes count
    only the tokens with ``w`` in ``[1/C, C]`` (``'mask'``) or the responses with ``W`` in
    it (``'sequence_mask'``, ``'geometric_mask'``), in the loss and in the minibatch's
    token / response totals; ``settings.behaviour_veto`` takes every response with a token
    ``w < v`` out of both, in any mode.

    Every rank takes the same number of steps per pass:
    ``ceil(N / minibatch_responses_per_rank)``, or, when rows were removed on any rank
    and ``kept_rows='full_minibatches'``, that of
    :func:`~gepo_xtuner.engine.step.batching.kept_minibatches` (fewer steps of full size;
    none when nothing is kept).

    Args:
        model: the policy as the runner holds it (DDP-wrapped or not).
        optim_wrapper: the run's optimizer wrapper (``accumulative_counts`` 1).
        batch: the step's N responses.
        old_logprobs: ``(N, R)`` from :func:`old_logprobs`.
        advantages: ``(N,)``.
        keep: ``(N,)`` bool, the rows to train, or None for all.
        settings: minibatch size, epochs, token budget, temperature, norm length.
        prime_buckets: give DDP the bucket layout of an uninterrupted run first
            (after ``--resume``;
            :func:`~gepo_xtuner.engine.step.optim_step.prime_gradient_buckets`).

    Returns:
        ``loss/*`` and ``ratio/*`` of the loss (:class:`MicroBatchStats`),
        ``optim/steps``, ``optim/micro_batches`` (mean per step), ``optim/rows_trained``,
        ``optim/minibatch_rows`` (rows per step over all ranks),
        ``optim/grad_norm`` (mean before clipping, when the wrapper clips) and, unless
        ``settings.behaviour_correction`` is ``'none'`` with no veto, ``offpolicy/*``
        over the valid tokens / responses of the trained rows on all ranks, before the cap:
        ``weight_mean`` and ``weight_max`` of ``w = pi_prox / mu``, then
        ``frac_truncated`` or ``frac_masked`` (token modes), ``seq_weight_mean``,
        ``seq_weight_max`` and ``frac_seq_truncated`` or ``frac_seq_masked`` (sequence /
        geometric modes), ``frac_vetoed`` (veto on) (:meth:`BehaviourCorrection.metrics`).
    """
    device = next(_unwrapped(model).parameters()).device
    packed = _packs(_unwrapped(model), batch)
    world, per_rank = dist_world_size(), settings.minibatch_responses_per_rank
    rows = torch.arange(len(batch)) if keep is None else keep.nonzero().flatten()
    prompt_len, response_len = batch.lengths()
    n_total, kept_total = (int(v) for v in all_reduce(
        torch.tensor([float(len(batch)), float(len(rows))], dtype=torch.float64)).tolist())
    # None for 'none' without a veto: then counted == response_mask and the loss inputs
    # carry nothing new
    correction = BehaviourCorrection.of(old_logprobs, batch.rollout_logprobs,
                                        batch.response_mask, settings.behaviour_correction,
                                        settings.behaviour_cap, settings.behaviour_veto)
    weights = None if correction is None else correction.loss_weights
    kept = None if correction is None else correction.loss_mask
    counted = batch.response_mask if kept is None else kept  # the tokens the loss counts
    counted_len = response_len if kept is None else kept.sum(1)

    def inputs(part: Tensor, totals: Tensor) -> LossInputs:
        return loss_inputs(batch, part, old_logprobs, advantages, totals,
                           temperature=settings.temperature,
                           norm_length=settings.norm_length, behaviour_weights=weights,
                           loss_mask=kept).to(device)

    def nothing(totals: Tensor) -> LossInputs:  # a micro-batch with no valid token: loss 0
        return inputs(torch.arange(1), totals).without_tokens()

    if prime_buckets:
        prime_gradient_buckets(model, optim_wrapper, nothing(torch.ones(3, dtype=torch.float64)))
    stats = MicroBatchStats()
    grad_norms: list[float] = []
    micro_counts: list[int] = []
    minibatch_rows: list[float] = []
    for _ in range(settings.ppo_epochs):
        if settings.kept_rows == 'full_minibatches' and kept_total < n_total:
            plan = kept_minibatches(rows, kept_total, per_rank, world)
        else:
            plan = minibatches(rows, math.ceil(len(batch) / per_rank))
        for minibatch in plan:
            mask = counted[minibatch]
            totals = all_reduce(torch.tensor([float(mask.sum()), float(mask.any(1).sum()),
                                              float(len(minibatch))], dtype=torch.float64))
            minibatch_rows.append(float(totals[2]))
            micro = micro_batches(minibatch, prompt_len, response_len,
                                  settings.max_tokens_per_micro_batch, packed)
            micro_counts.append(len(micro))
            logs, grad_norm = optimizer_step(
                model, optim_wrapper, [inputs(m, totals) for m in micro],
                loss_scale=float(world), pad=lambda: nothing(totals))
            tokens = [int(counted_len[m].sum()) for m in micro]
            stats.add_minibatch(logs, tokens + [0] * (len(logs) - len(tokens)))
            if grad_norm is not None:
                grad_norms.append(grad_norm)
    metrics = stats.reduce()
    metrics['optim/steps'] = float(len(micro_counts))
    metrics['optim/micro_batches'] = sum(micro_counts) / max(len(micro_counts), 1)
    metrics['optim/rows_trained'] = float(len(rows))
    metrics['optim/minibatch_rows'] = sum(minibatch_rows) / max(len(minibatch_rows), 1)
    if grad_norms:
        metrics['optim/grad_norm'] = sum(grad_norms) / len(grad_norms)
    if correction is not None:
        sums, top = correction.metric_sums(rows)
        metrics.update(correction.metrics(correction.mode, all_reduce(sums),
                                          all_reduce(top, 'max'), correction.veto))
    return metrics


class MicroBatchStats:
    """Reduces the loss outputs of micro-batches, minibatches and ranks to step metrics.

    - ``loss/pg``, ``loss/kl_ref``, ``loss/cov_tokens``: each micro-batch
      holds its share of a minibatch-normalised sum, so they add up over
      micro-batches and ranks; the step value is their mean over minibatches.
    - ``loss`` (the objective, ``loss/pg`` plus ``kl_coef * loss/kl_ref``) is not
      repeated.
    - ``ratio/max`` / ``ratio/min``: maximum / minimum.
    - everything else (fractions, means): weighted by the micro-batch's tokens.

    Two all-reduces per step (sum, max), whatever the number of micro-batches.
    """

    ADDITIVE = ('loss/pg', 'loss/kl_ref', 'loss/cov_tokens')
    EXTREMES = {'ratio/max': 1.0, 'ratio/min': -1.0}  # sign: reduce all as a max

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.extremes: dict[str, float] = {}
        self.tokens = 0.0
        self.minibatches = 0

    def add_minibatch(self, logs: list[dict[str, Tensor]], tokens: list[int]) -> None:
        """One optimizer step's micro-batch outputs and their valid-token counts."""
        self.minibatches += 1
        for log_vars, n in zip(logs, tokens):
            self.tokens += n
            for key, value in log_vars.items():
                if key == 'loss':
                    continue
                value = float(value)
                if key in self.EXTREMES:
                    if n:
                        v = self.EXTREMES[key] * value
                        self.extremes[key] = max(self.extremes.get(key, -math.inf), v)
                    continue
                weight = 1.0 if key in self.ADDITIVE else float(n)
                self.sums[key] = self.sums.get(key, 0.0) + weight * value

    def reduce(self) -> dict[str, float]:
        """The step's metrics over all ranks (a collective)."""
        keys = sorted(self.sums)
        sums = all_reduce(torch.tensor([self.sums[k] for k in keys] + [self.tokens],
                                       dtype=torch.float64)).tolist()
        tokens = sums.pop()
        out = {}
        for key, value in zip(keys, sums):
            name = key if key.startswith(('loss', 'ratio')) else f'loss/{key}'
            out[name] = (value / max(self.minibatches, 1) if key in self.ADDITIVE
                         else value / max(tokens, 1.0))
        ext_keys = sorted(self.EXTREMES)
        ext = all_reduce(torch.tensor([self.extremes.get(k, -math.inf) for k in ext_keys],
                                      dtype=torch.float64), 'max').tolist()
        for key, value in zip(ext_keys, ext):
            if math.isfinite(value):
                out[key] = self.EXTREMES[key] * value
        return out


def entropy_metrics(batch: ResponseBatch, old_logprobs: Tensor, entropy: Tensor,
                    domain_ids: Tensor, names: list[str], rollout_comparable: bool = True
                    ) -> dict[str, float]:
    """The policy's mean full-vocabulary entropy per response (overall and per domain) and
    the mean gap between the trainer's and the rollout's logprobs.

    Args:
        batch: the step's N responses.
        old_logprobs, entropy: ``(N, R)`` from :func:`old_logprobs`.
        domain_ids: ``(N,)`` long, index into ``names``.
        names: the step's domains.
        rollout_comparable: whether the rollout's logprobs are under the distribution the
            trainer scores (the backend's logprob temperature is the sampling one); when
            not, ``rollout/logprob_abs_diff`` would measure the temperature, not a drift,
            and is left out.

    Returns:
        ``entropy/policy``, ``entropy/policy/<domain>``, ``rollout/logprob_abs_diff``.
    """
    mask = batch.response_mask
    tokens = mask.sum(1).clamp_min(1)
    per_seq = torch.where(mask, entropy, 0).sum(1) / tokens
    metrics = {'entropy/policy': float(per_seq.mean())}
    if rollout_comparable:
        metrics['rollout/logprob_abs_diff'] = float(
            torch.where(mask, (old_logprobs - batch.rollout_logprobs).abs(), 0).sum()
            / mask.sum().clamp_min(1))
    for d, name in enumerate(names):
        metrics[f'entropy/policy/{name}'] = float(per_seq[domain_ids == d].mean())
    return metrics


class NoSignalWatch:
    """Warns when no response of the global batch has had a non-zero advantage for
    ``steps`` steps in a row: such steps change nothing (``loss/pg`` 0, gradient 0) but
    cost a full rollout.

    Args:
        steps: consecutive steps without signal before the warning.
    """

    def __init__(self, steps: int = 3) -> None:
        self.steps = steps
        self.quiet = 0  # consecutive steps without signal so far

    def observe(self, advantages: Tensor, metrics: dict[str, float]) -> None:
        """Counts this step (a collective: one all-reduce) and warns at ``steps``."""
        nonzero = all_reduce(torch.tensor([float((advantages != 0).sum())],
                                          dtype=torch.float64))
        self.quiet = 0 if nonzero.item() > 0 else self.quiet + 1
        if self.quiet == self.steps:
            print_log(
                f'no learning signal for {self.quiet} steps: every response had advantage 0 '
                f'(reward/mean {metrics.get("reward/mean", float("nan")):.3f}; within each '
                'group all rewards were equal). Check that the reward function can score this '
                'policy (tools/evaluate.py on a few records), or raise num_responses, the '
                'sampling temperature, or use easier prompts / a warm-started model',
                logger='current', level=logging.WARNING)


def resolve_behaviour_correction(correction: str, max_staleness: int) -> str:
    """``train_cfg.behaviour_correction`` as the loss takes it: ``'auto'`` is
    ``'truncate'`` when generation runs ahead (``max_staleness >= 1``), else ``'none'``."""
    if correction == 'auto':
        return 'truncate' if max_staleness else 'none'
    return correction


def behaviour_refusal(logprob_temperature: float, params: SamplingParams, correction: str,
                      entropy_logprobs: str, veto: float | None = None) -> str | None:
    """Why the rollout's logprobs cannot be used as the sampling policy's, or None.

    The behaviour logprobs of a response are ``log softmax(z / tau)`` at the sampled
    tokens, with the behaviour weights' logits ``z`` and the sampling temperature
    ``tau``. A backend that reports them at another temperature ``t`` (LMDeploy's raw
    logprobs: ``t = 1``) gives ``z_y / t - logsumexp(z / t)``; the tempered value needs
    ``logsumexp(z / tau)`` over the whole vocabulary under the weights that sampled,
    which nobody holds any more: there is no rescaling. So with ``t != tau`` the
    importance weight ``exp(proximal - behaviour)`` (and the veto that reads it) and a
    group entropy from behaviour logprobs would be those of another distribution, and are
    refused.

    Args:
        logprob_temperature: ``t``, from the backend's ``logprob_temperature(params)``.
        params: the training sampling (``tau = params.temperature``).
        correction: the resolved ``train_cfg.behaviour_correction``.
        entropy_logprobs: ``train_cfg.entropy_logprobs``.
        veto: ``train_cfg.behaviour_veto``.

    Returns:
        None when ``t == tau`` or nothing reads the rollout's logprobs as the sampling
        policy's; else the reason, naming the settings that avoid it.
    """
    if logprob_temperature == params.temperature:
        return None
    uses = ([f"train_cfg.behaviour_correction='{correction}'"] if correction != 'none' else []) + (
        [f'train_cfg.behaviour_veto={veto!r}'] if veto is not None else []) + (
        ["train_cfg.entropy_logprobs='behaviour'"] if entropy_logprobs == 'behaviour' else [])
    if not uses:
        return None
    return (f'{" and ".join(uses)} read(s) the rollout\'s logprobs as those of the sampling '
            f'distribution softmax(logits / {params.temperature:g}), but the rollout backend '
            f'reports them at temperature {logprob_temperature:g} (LMDeploy returns raw logprobs, '
            'before the temperature) and they cannot be rescaled; sample at '
            f'train_cfg.sampling.temperature={logprob_temperature:g}, or set '
            "behaviour_correction='none' (train on responses one version old without a weight)"
            f"{', behaviour_veto=None' if veto is not None else ''} "
            "and entropy_logprobs='proximal'")


def check_training_sampling(params: SamplingParams) -> None:
    """Refuses sampling settings whose distribution the trainer cannot score.

    The trainer's logprobs (importance ratio, GEPO's group entropy) are those of
    ``softmax(logits / temperature)``; nucleus or top-k truncation would make the
    sampled distribution a different one.

    Raises:
        ValueError: naming the setting and the value to use.
    """
    if params.temperature <= 0:
        raise ValueError('train_cfg.sampling.temperature must be > 0 for training (greedy '
                         'decoding has no sampling distribution to score); the paper uses 1.0')
    if params.top_p < 1.0 or params.top_k > 0:
        raise ValueError(
            f'train_cfg.sampling has top_p={params.top_p}, top_k={params.top_k}: the trainer '
            'scores responses under the full softmax(logits / temperature), so a truncated '
            'sampling distribution would bias the importance ratio and the group entropy; set '
            'top_p=1.0 and top_k=0 (validation may still use them, train_cfg.val)')

