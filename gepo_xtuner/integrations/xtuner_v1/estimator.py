"""GEPO as an XTuner v1 advantage estimator, with the batch-level pass v1 lacks.

XTuner v1 calls ``AdvantageEstimator.compute(rewards (K,), group)`` once per prompt
group. GEPO's entropy band needs the mean and std of the group entropies of the
whole step before any group is shaped, so :class:`StepAdvantageEstimator` adds a
step-level contract on top of v1's interface (driven by
:class:`~gepo_xtuner.integrations.xtuner_v1.trainer.StepAdvantageTrainerMixin`):

1. ``begin_step(groups)``: once per training step, with every group of the step.
2. ``compute(rewards, group)``: v1's own per-group calls.
3. ``end_step()``: after the last group.

and run state with ``state_dict()`` / ``load_state_dict()``, saved as
``state_filename`` in v1's ``ckpt-step-N/``.

:class:`GEPOEstimator` does all of GEPO in ``begin_step``, with this project's
:class:`~gepo_xtuner.advantage.GEPOAdvantage` over the flat batch of the step (one
band update of :class:`~gepo_xtuner.advantage.EntropyThresholdState` per step);
``compute`` hands each group its share.
"""

from __future__ import annotations

import inspect
from abc import abstractmethod
from collections.abc import Sequence
from typing import Annotated, Any

import torch
from cyclopts import Parameter
from pydantic import model_validator
from torch import Tensor
from xtuner.v1.rl.advantage import AdvantageEstimator, BaseAdvantageConfig
from xtuner.v1.rl.advantage.config import advantage_group

from ...advantage import EntropyThresholdState, GEPOAdvantage, AdvantageInputs, encode_domains
from ...ops.distributed import dist_world_size
from ...ops.ragged import pad_ragged

__all__ = ['StepAdvantageEstimator', 'GEPOEstimator', 'GEPOAdvantageConfig',
           'trainable_logprobs', 'session_key']

# v1 marks tokens that carry no loss with this label (prompt, tool output).
IGNORE_LABEL = -100
#: GEPO's defaults (the paper's values), read from GEPOAdvantage, where they are written.
DEFAULTS: dict[str, float] = {name: p.default for name, p in
                              inspect.signature(GEPOAdvantage).parameters.items()
                              if name in ('alpha_low', 'alpha_high', 'beta_low', 'beta_high',
                                          'gamma', 'eps')}


class StepAdvantageEstimator(AdvantageEstimator):
    """A v1 advantage estimator that sees the whole step before its per-group calls.

    The trainer (:class:`~gepo_xtuner.integrations.xtuner_v1.trainer.StepAdvantageTrainerMixin`)
    calls :meth:`begin_step` once per training step with every group v1 will train on,
    then v1's ``compute`` once per group, then :meth:`end_step`. Run state that must
    survive a resume goes through :meth:`state_dict` / :meth:`load_state_dict` (JSON
    values) and is saved as :attr:`state_filename` in each ``ckpt-step-N/``.
    """

    #: File name of the state in ``ckpt-step-N/``; None for an estimator without state.
    state_filename: str | None = None

    @abstractmethod
    def begin_step(self, groups: Sequence[Sequence[Any]]) -> dict[str, float]:
        """Sees every group of the step; returns scalar metrics named ``area/metric``."""

    def end_step(self) -> None:
        """Drops per-step data after the last ``compute`` of the step."""

    def state_dict(self) -> dict[str, Any] | None:
        """JSON-serialisable run state, or None if the estimator keeps none."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned."""


def session_key(item: Any) -> Any:
    """The key v1 groups trainable segments of one model session by.

    v1 computes one advantage per session: agentic loops split a session into
    several segments that share ``session_id``; plain rollouts have none and are
    keyed by their ``rollout_id``.
    """
    return item.session_id if item.session_id is not None else item.rollout_id


def trainable_logprobs(item: Any) -> list[float]:
    """Rollout logprobs of the tokens v1 trains on, for one ``RolloutState``.

    * ``input_ids`` given (agentic, whole-sequence form): ``logprobs`` is aligned with
      ``input_ids``; token t is trained on when ``labels[t] != -100`` (t >= 1).
    * otherwise: ``logprobs`` is aligned with ``response_ids``; tokens with
      ``response_mask == 0`` (e.g. tool output) are left out.

    Raises:
        ValueError: if the rollout has no logprobs (GEPO measures entropy from them).
    """
    lps = item.logprobs
    if lps is None:
        raise ValueError(
            f'rollout {item.rollout_id} (task {item.task_name!r}) has no logprobs: GEPO measures '
            'group entropy from the rollout engine\'s sampled-token logprobs; keep '
            'SampleParams(return_logprob=True) in the training agent loop')
    if item.input_ids is not None:
        labels = item.labels or []
        return [lp for lp, label in zip(lps[1:], labels[1:]) if label != IGNORE_LABEL]
    mask = item.response_mask
    if mask is None:
        return list(lps)
    return [lp for lp, m in zip(lps, mask) if m != 0]


def _domain(item: Any) -> str:
    if item.task_name:
        return str(item.task_name)
    return item.data_source if isinstance(item.data_source, str) else 'default'


class GEPOEstimator(StepAdvantageEstimator):
    """GEPO (Group Entropy-Controlled Policy Optimization) for XTuner v1's RL trainer.

    In :meth:`begin_step`, the step's sessions form one flat batch: group g holds the
    sessions of one prompt, each with reward r_i and the rollout logprobs of its
    trainable tokens (all its segments). :class:`~gepo_xtuner.advantage.GEPOAdvantage`
    then computes, over all G groups together,

        A_i = (r_i - mean_g(r)) / (std_g(r) + eps)                (GRPO, Bessel std)
        H_g = sum_i sum_t (-lp_it) / sum_i T_i                     (group entropy)
        [H_low(t), H_high(t)] from mu / sigma of {H_g}, EMA gamma  (one update per step)
        A_hat_i = alpha_low A_i if A_i > 0 and H_g < H_low(t);
                  alpha_high A_i if A_i < 0 and H_g > H_high(t);  A_i otherwise

    and each of v1's per-group ``compute`` calls returns its group's ``A_hat``.

    Partial rollouts: a response continued across weight updates carries logprobs of
    several policy versions. All its trainable tokens count, each with the logprob of
    the policy that sampled it: H_g measures the distribution that produced the
    group, as the paper measures it with the behaviour policy's logprobs, and dropping
    the older tokens would measure only response tails. ``gepo/stale_response_frac``
    reports the share of responses with ``seq_staleness > 0``.

    Args:
        alpha_low, alpha_high, beta_low, beta_high, gamma, eps: as
            :class:`~gepo_xtuner.advantage.GEPOAdvantage`, whose defaults (the paper's
            values) they take.
    """

    state_filename = 'gepo_threshold_state.json'

    def __init__(self, alpha_low: float = DEFAULTS['alpha_low'],
                 alpha_high: float = DEFAULTS['alpha_high'],
                 beta_low: float = DEFAULTS['beta_low'], beta_high: float = DEFAULTS['beta_high'],
                 gamma: float = DEFAULTS['gamma'], eps: float = DEFAULTS['eps']) -> None:
        self.processor = GEPOAdvantage(alpha_low=alpha_low, alpha_high=alpha_high,
                                       beta_low=beta_low, beta_high=beta_high, gamma=gamma,
                                       eps=eps)
        self.state: EntropyThresholdState = self.processor.init_state()
        # id(representative RolloutState) -> (reward, shaped advantage), for this step only;
        # _items keeps the objects alive so their ids stay unique until end_step.
        self._step: dict[int, tuple[float, float]] = {}
        self._items: list[Any] = []

    def begin_step(self, groups: Sequence[Sequence[Any]]) -> dict[str, float]:
        """Runs GEPO over every group of the step (one band update).

        Args:
            groups: the step's prompt groups (lists of v1 ``RolloutState``) that v1
                will train on.

        Returns:
            ``gepo/*`` (band, batch statistics), ``shaping/*`` and per-domain
            ``entropy/group_nll/<task>`` metrics.
        """
        if dist_world_size() > 1:
            raise RuntimeError(
                'GEPOEstimator runs in v1\'s single trainer driver, which holds every group of '
                'the step; torch.distributed is initialised with several processes here, and '
                'the batch statistics would be all-reduced over copies of the same batch')
        self.end_step()
        rewards: list[float] = []
        group_ids: list[int] = []
        token_lps: list[list[float]] = []
        domains: list[str] = []
        representatives: list[Any] = []
        num_items = num_stale = 0
        for g, group in enumerate(groups):
            sessions: dict[Any, int] = {}
            for item in group:
                num_items += 1
                num_stale += int(getattr(item, 'seq_staleness', 0) > 0)
                lps = trainable_logprobs(item)
                row = sessions.get(session_key(item))
                if row is None:  # first segment of a session: its reward is the session's
                    sessions[session_key(item)] = len(rewards)
                    rewards.append(float(item.reward['score']))
                    group_ids.append(g)
                    token_lps.append(lps)
                    domains.append(_domain(item))
                    representatives.append(item)
                else:
                    token_lps[row] = token_lps[row] + lps
        if not rewards:
            return {}
        logprobs, mask = pad_ragged(token_lps)
        domain_ids, domain_names = encode_domains(domains)
        out = self.processor(
            AdvantageInputs(rewards=torch.tensor(rewards, dtype=torch.float64),
                         group_ids=torch.tensor(group_ids), logprobs=logprobs, mask=mask,
                         domain_ids=domain_ids, domain_names=domain_names,
                         prompt_ids=[f'group {g}' for g in group_ids]), self.state)
        for item, reward, adv in zip(representatives, rewards, out.advantages.tolist()):
            self._step[id(item)] = (reward, adv)
        self._items = representatives
        metrics = {k: v for k, v in out.metrics.items()
                   if k.startswith(('gepo/', 'shaping/', 'entropy/group_nll'))}
        metrics['gepo/stale_response_frac'] = num_stale / num_items
        return metrics

    def compute(self, rewards: Tensor, group: list[Any]) -> Tensor:
        """Returns the shaped advantages :meth:`begin_step` computed for this group.

        Args:
            rewards: ``(K,)`` the group's session rewards, as v1 passes them.
            group: the K session representatives v1 passes.

        Returns:
            ``(K,)`` float32 advantages.

        Raises:
            RuntimeError: if this step's batch pass did not see the group (the trainer
                is not a GEPO one) or saw other rewards for it.
        """
        try:
            seen = [self._step[id(item)] for item in group]
        except KeyError:
            raise RuntimeError(
                'GEPOEstimator needs a batch-level pass over the whole step before the per-group '
                'calls, which v1\'s own trainers do not make: build the trainer with '
                'gepo_xtuner.integrations.xtuner_v1.GEPORLColocateTrainerConfig (or '
                'GEPORLDisaggregatedTrainerConfig) instead of RLColocateTrainerConfig') from None
        expected = torch.tensor([r for r, _ in seen], dtype=rewards.dtype, device=rewards.device)
        if not torch.equal(expected, rewards):
            raise RuntimeError(f'rewards {rewards.tolist()} differ from the ones seen by the step\'s '
                               f'batch pass {expected.tolist()}')
        return torch.tensor([a for _, a in seen], dtype=torch.float32, device=rewards.device)

    def end_step(self) -> None:
        self._step = {}
        self._items = []

    def state_dict(self) -> dict[str, Any]:
        return self.state.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.load_state_dict(state)

    def __repr__(self) -> str:
        p = self.processor
        return (f'GEPOEstimator(alpha_low={p.alpha_low}, alpha_high={p.alpha_high}, '
                f'beta_low={p.beta_low}, beta_high={p.beta_high}, gamma={p.gamma}, eps={p.eps})')


def _param(help_text: str) -> Parameter:
    return Parameter(group=advantage_group, help=help_text)


class GEPOAdvantageConfig(BaseAdvantageConfig):
    """Configuration for :class:`GEPOEstimator` (GEPO paper, section 2; defaults: section 3.1).

    Needs a trainer that makes GEPO's batch-level pass:
    :class:`~gepo_xtuner.integrations.xtuner_v1.GEPORLColocateTrainerConfig` or
    :class:`~gepo_xtuner.integrations.xtuner_v1.GEPORLDisaggregatedTrainerConfig`.

    Every default is :class:`~gepo_xtuner.advantage.GEPOAdvantage`'s (the paper's value).

    Attributes:
        alpha_low (float): scale of positive advantages in groups below the band, in
            [0, 1]; 1 is the paper's "w/o low entropy control" ablation.
        alpha_high (float): scale of negative advantages in groups above the band, in
            [0, 1]; 1 is "w/o high entropy control".
        beta_low (float): lower band margin in batch stds, >= 0.
        beta_high (float): upper band margin in batch stds, >= 0.
        gamma (float): EMA rate of the band per step, in (0, 1].
        eps (float): GRPO's std guard, > 0.
    """

    alpha_low: Annotated[float, _param('Scale of A > 0 in low-entropy groups.')] = DEFAULTS['alpha_low']
    alpha_high: Annotated[float, _param('Scale of A < 0 in high-entropy groups.')] = DEFAULTS['alpha_high']
    beta_low: Annotated[float, _param('Lower band margin, in stds.')] = DEFAULTS['beta_low']
    beta_high: Annotated[float, _param('Upper band margin, in stds.')] = DEFAULTS['beta_high']
    gamma: Annotated[float, _param('EMA rate of the band.')] = DEFAULTS['gamma']
    eps: Annotated[float, _param('GRPO std guard.')] = DEFAULTS['eps']

    @model_validator(mode='after')
    def _check_ranges(self) -> 'GEPOAdvantageConfig':
        self.build()  # GEPOAdvantage refuses out-of-range values, naming the field
        return self

    def build(self) -> GEPOEstimator:
        return GEPOEstimator(alpha_low=self.alpha_low, alpha_high=self.alpha_high,
                             beta_low=self.beta_low, beta_high=self.beta_high, gamma=self.gamma,
                             eps=self.eps)

