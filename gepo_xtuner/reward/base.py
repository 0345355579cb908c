"""Per-domain reward routing with failure isolation."""

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from mmengine.logging import print_log

from ..registry import REWARDS

RewardFn = Callable[[str, dict[str, Any]], float]


@REWARDS.register_module()
class ExactMatchReward:
    """1.0 if the stripped completion equals the record's ``answer``, else 0.0.

    Example:
        >>> ExactMatchReward()(' 42 ', {'answer': '42'})
        1.0
        >>> ExactMatchReward()('41', {'answer': '42'})
        0.0
    """

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
        failures: list[str | None] = []
        values = []
        for completion, record in zip(completions, records):
            domain = record.get(self.route_by) or record['domain']
            failures.append(None)
            try:
                value = float(self.fn_for(domain)(completion, record))
                if not math.isfinite(value):
                    raise ValueError(f'reward function returned {value}')
            except Exception as exc:  # a verifier bug must not kill the run
                if isinstance(exc, ValueError) and str(exc).startswith('no reward function'):
                    raise
                errors[domain] += 1
                failures[-1] = f'{type(exc).__name__}: {exc}'
                value = 0.0
                key = (domain, type(exc).__name__)
                if key not in self._warned:
                    self._warned.add(key)
                    print_log(f'reward function for domain {domain!r} failed on record '
                              f'{record.get("id", "?")!r} ({type(exc).__name__}: {exc}); '
                              'scoring 0 (further failures of this kind are counted in '
                              f'reward/errors/{domain})', logger='current', level=30)
            values.append(value)
        domains = {r.get(self.route_by) or r['domain'] for r in records}
        metrics = {f'reward/errors/{d}': float(errors[d]) for d in sorted(domains)}
        return torch.tensor(values, dtype=torch.float32), metrics, failures
