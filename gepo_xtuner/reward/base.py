"""The reward contract (:class:`Reward`) and per-domain routing with failure isolation."""

import abc
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from mmengine.logging import print_log

from ..registry import REWARDS

RewardFn = Callable[[str, dict[str, Any]], float]


class Scored(float):
    """A reward value that also names what happened to the sample.

    ``Scored(0.0, 'invalid_output')`` is the number 0.0 everywhere a float is used; the
    router counts the outcome in ``reward/<outcome>/<domain>`` (:attr:`Reward.outcomes`).
    It is not an error: the reward scored the sample (e.g. a program whose output broke
    the answer format scores 0 as a wrong answer would).

    >>> v = Scored(0.0, 'invalid_output')
    >>> v == 0.0, v.outcome, float(v) + 1
    (True, 'invalid_output', 1.0)
    """

    outcome: str | None

    def __new__(cls, value: float, outcome: str | None = None) -> 'Scored':
        obj = super().__new__(cls, value)
        obj.outcome = outcome
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return Scored, (float(self), self.outcome)


def _outcome(value: Any) -> str | None:
    """The outcome a reward value names (:class:`Scored`), or None."""
    outcome = getattr(value, 'outcome', None)
    return outcome if isinstance(outcome, str) else None


def scores_in_batches(fn: Any) -> bool:
    """Whether ``fn`` is a :class:`Reward` with its own :meth:`Reward.score_batch` (a
    batched server request, the code reward's threads), which scoring goes through."""
    return isinstance(fn, Reward) and type(fn).score_batch is not Reward.score_batch


class Reward(abc.ABC):
    """Base class and contract of the reward functions (:data:`~gepo_xtuner.registry.REWARDS`).

    * ``reward(completion, record) -> float``: one decoded response and its prompt
      record; a finite number (1.0 / 0.0 for verifiable tasks). A reward that raises
      or returns a non-finite value scores 0 for that sample and is counted in
      ``reward/errors/<domain>`` (:class:`RewardRouter`); the step goes on.
    * :meth:`score_batch`: all responses of one step routed to this reward at once,
      in order. The default calls ``__call__`` per sample; a reward model behind a
      server overrides it to send one batched request. When a batch call raises,
      the router scores that batch again sample by sample, so one bad sample costs
      only its own reward.
    * :meth:`check_record`: the problems of a record for this reward (missing or
      malformed reference fields), checked for every training and validation
      record when the RL loop is built, so a bad file fails before the first step.
      Declare the fields in :attr:`required_fields`; override :meth:`parse_record`
      for checks beyond presence.
    * Arguments are validated in ``__init__``; a reward holds no state that changes
      during training.
    * A reward may return :class:`Scored` to name a sample's outcome; the router counts
      each name listed in :attr:`outcomes` per domain, ``reward/<outcome>/<domain>``
      (0 when none happened), e.g. ``reward/invalid_output/code``.

    Adding one::

        @REWARDS.register_module()
        class LengthReward(Reward):
            required_fields = ('max_chars',)

            def __call__(self, completion, record):
                return float(len(completion) <= record['max_chars'])
    """

    #: Fields every record this reward scores must have (not None).
    required_fields: tuple[str, ...] = ()
    #: Outcomes (:class:`Scored`) the router logs as ``reward/<outcome>/<domain>``.
    outcomes: tuple[str, ...] = ()

    @abc.abstractmethod
    def __call__(self, completion: str, record: dict[str, Any]) -> float:
        """The reward of one response to ``record``'s prompt."""

    def score_batch(self, completions: Sequence[str], records: Sequence[dict[str, Any]]
                    ) -> list[float]:
        """Rewards of N responses (``completions[i]`` answers ``records[i]``)."""
        return [self(c, r) for c, r in zip(completions, records)]

    def parse_record(self, record: dict[str, Any]) -> None:
        """Raises ``ValueError`` / ``TypeError`` for a record this reward cannot score."""

    def check_record(self, record: dict[str, Any]) -> list[str]:
        """Problems of ``record`` for this reward, one line each; empty if it can be scored."""
        missing = [f for f in self.required_fields if record.get(f) is None]
        if missing:
            return [f'{type(self).__name__} needs field(s) {missing}']
        try:
            self.parse_record(record)
        except (TypeError, ValueError) as exc:
            return [f'{type(self).__name__}: {exc}']
        return []


@REWARDS.register_module()
class ExactMatchReward(Reward):
    """1.0 if the stripped completion equals the record's ``answer``, else 0.0.

    Example:
        >>> ExactMatchReward()(' 42 ', {'answer': '42'})
        1.0
        >>> ExactMatchReward()('41', {'answer': '42'})
        0.0
    """

    required_fields = ('answer',)

    def __call__(self, completion: str, record: dict[str, Any]) -> float:
        return float(completion.strip() == str(record['answer']).strip())


class RewardRouter:
    """Scores each completion with the reward function of its record's domain.

    A reward function that raises, or returns a non-finite value, gives that
    sample reward 0; the failure is counted in ``reward/errors/<domain>`` and
    logged as a warning (once per domain and error type, with the record id), and
    the step goes on.

    Args:
        rewards: domain name -> reward config (``dict(type=...)`` from
            :data:`~gepo_xtuner.registry.REWARDS`) or callable
            ``fn(completion, record) -> float``. The key ``'default'`` serves
            domains without their own entry.
        route_by: the record field whose value picks the function: ``'domain'``
            (default) or ``'data_source'`` (one function per benchmark; a record
            without ``data_source`` uses its ``domain``).

    Raises:
        ValueError: if a record's domain has no function and there is no default.
    """

    def __init__(self, rewards: Mapping[str, Any], route_by: str = 'domain') -> None:
        if not rewards:
            raise ValueError("rewards is empty: give at least dict(default=dict(type='...'))")
        if route_by not in ('domain', 'data_source'):
            raise ValueError(f"route_by must be 'domain' or 'data_source', got {route_by!r}")
        self.route_by = route_by
        self.fns: dict[str, RewardFn] = {
            name: REWARDS.build(cfg) if isinstance(cfg, Mapping) else cfg
            for name, cfg in rewards.items()
        }
        self._warned: set[tuple[str, str]] = set()

    def check_records(self, records: Sequence[dict[str, Any]], what: str) -> None:
        """Checks every record against the reward it routes to (:meth:`Reward.check_record`).

        Raises:
            ValueError: naming up to five bad records (id, reward, problem) and the count.
        """
        problems = []
        for record in records:
            fn = self.fn_for(record.get(self.route_by) or record['domain'])
            for problem in (fn.check_record(record) if isinstance(fn, Reward) else ()):
                problems.append(f'record {record.get("id", "?")!r}: {problem}')
        if problems:
            shown = '\n  '.join(problems[:5])
            more = f'\n  ... and {len(problems) - 5} more' if len(problems) > 5 else ''
            raise ValueError(f'{what}: {len(problems)} record(s) cannot be scored by their '
                             f'reward:\n  {shown}{more}\nadd the fields, or route these records '
                             'to another reward (train_cfg.rewards)')

    def fn_for(self, domain: str) -> RewardFn:
        fn = self.fns.get(domain, self.fns.get('default'))
        if fn is None:
            raise ValueError(f'no reward function for {self.route_by} {domain!r}; configure '
                             f'rewards[{domain!r}] or rewards["default"] '
                             f'(configured: {sorted(self.fns)})')
        return fn

    def __call__(self, completions: Sequence[str], records: Sequence[dict[str, Any]]
                 ) -> tuple[torch.Tensor, dict[str, float]]:
        """Scores N completions.

        Returns:
            ``(rewards (N,) float32, metrics)`` with ``reward/errors/<domain>``
            counts for the domains present.
        """
        rewards, metrics, _ = self.score(completions, records)
        return rewards, metrics

    def score(self, completions: Sequence[str], records: Sequence[dict[str, Any]]
              ) -> tuple[torch.Tensor, dict[str, float], list[str | None]]:
        """Like :meth:`__call__`, plus each sample's failure (``'Type: message'``) or None."""
        errors: Counter[str] = Counter()
        outcomes: Counter[tuple[str, str]] = Counter()
        failures: list[str | None] = [None] * len(records)
        batched = self._score_batched(completions, records)
        values = []
        for i, (completion, record) in enumerate(zip(completions, records)):
            domain = record.get(self.route_by) or record['domain']
            if batched[i] is not None:
                outcomes[(_outcome(batched[i]), domain)] += 1
                values.append(float(batched[i]))
                continue
            try:
                raw = self.fn_for(domain)(completion, record)
                value = float(raw)
                if not math.isfinite(value):
                    raise ValueError(f'reward function returned {value}')
            except Exception as exc:  # a verifier bug must not kill the run
                if isinstance(exc, ValueError) and str(exc).startswith('no reward function'):
                    raise
                errors[domain] += 1
                failures[i] = f'{type(exc).__name__}: {exc}'
                value = 0.0
                key = (domain, type(exc).__name__)
                if key not in self._warned:
                    self._warned.add(key)
                    print_log(f'reward function for domain {domain!r} failed on record '
                              f'{record.get("id", "?")!r} ({type(exc).__name__}: {exc}); '
                              'scoring 0 (further failures of this kind are counted in '
                              f'reward/errors/{domain})', logger='current', level=30)
            else:
                outcomes[(_outcome(raw), domain)] += 1
            values.append(value)
        domains = {r.get(self.route_by) or r['domain'] for r in records}
        metrics = {f'reward/errors/{d}': float(errors[d]) for d in sorted(domains)}
        for d in sorted(domains):
            for name in getattr(self.fn_for(d), 'outcomes', ()):
                metrics[f'reward/{name}/{d}'] = float(outcomes[(name, d)])
        return torch.tensor(values, dtype=torch.float32), metrics, failures

    def _score_batched(self, completions: Sequence[str], records: Sequence[dict[str, Any]]
                       ) -> list[float | None]:
        """Values from the rewards that override :meth:`Reward.score_batch`, one call per
        reward; None where the sample is scored one by one (every other reward, and a
        batch that raised or returned a non-finite value or the wrong count)."""
        out: list[float | None] = [None] * len(records)
        rows: dict[int, list[int]] = {}
        fns: dict[int, Reward] = {}
        for i, record in enumerate(records):
            fn = self.fn_for(record.get(self.route_by) or record['domain'])
            if scores_in_batches(fn):
                rows.setdefault(id(fn), []).append(i)
                fns[id(fn)] = fn
        for key, idx in rows.items():
            try:
                values = [v if isinstance(v, Scored) else float(v) for v in fns[key].score_batch(
                    [completions[i] for i in idx], [records[i] for i in idx])]
            except Exception:  # noqa: BLE001 -- rescored per sample, which reports the error
                continue
            if len(values) == len(idx) and all(math.isfinite(v) for v in values):
                for i, v in zip(idx, values):
                    out[i] = v
        return out
