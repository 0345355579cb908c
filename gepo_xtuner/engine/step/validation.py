"""Validation during training: held-out files scored every few steps, across ranks."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...data.records import DataFormatError, load_records
from ...ops.distributed import all_reduce_sum, dist_rank, dist_world_size
from ...reward import RewardRouter
from ...rollout import RolloutBackend, RolloutRequest, SamplingParams
from .scoring import sample_and_score

#: Keys of one ``benchmarks`` entry.
BENCHMARK_KEYS = ('name', 'path', 'n', 'temperature', 'top_p', 'top_k', 'max_new_tokens',
                  'required', 'fields', 'default_domain')


@dataclass
class ValSet:
    """One held-out file and how to sample on it.

    Attributes:
        name: the benchmark's metric name, or None for the single-file form, whose
            metrics are per domain.
        records: the validated records.
        n, temperature, top_p, top_k, max_new_tokens: sampling (``max_new_tokens``
            None: the training sampling's).
    """

    name: str | None
    records: list[dict[str, Any]]
    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int | None = None

    def groups(self) -> list[str]:
        """Metric names this set logs (``val/<group>/acc``)."""
        return sorted({r['domain'] for r in self.records}) if self.name is None else [self.name]

    def group_of(self, record: dict[str, Any]) -> str:
        return record['domain'] if self.name is None else self.name


class Validator:
    """Scores the policy on held-out files every ``interval`` steps (``val=dict(...)``).

    Two forms, which can be combined:

    * ``val=dict(path='val.jsonl', interval=10)``: one file, greedy by default,
      logged per domain as ``val/<domain>/acc``;
    * ``val=dict(interval=10, benchmarks=[dict(name='aime25', path=..., n=4,
      temperature=0.6), ...])``: one metric per benchmark, ``val/<name>/acc``.

    ``val/<x>/acc`` is the mean reward over all of its records and their ``n``
    samples (accuracy for 0/1 rewards; avg@n for ``n > 1``), and ``val/acc`` the
    mean of the ``val/<x>/acc`` values. Each rank takes every world-size-th record
    of each file; sums and counts are all-reduced, so every rank logs the same
    values. The rollout backend is called once per file on every rank, also with no
    records, because some backends' ``generate`` is collective.

    Args:
        path: a held-out file (JSONL or Parquet, :mod:`gepo_xtuner.data.records`
            schema), read and validated when the loop is built.
        interval: validate every ``interval`` steps, before the first and after the last.
        max_new_tokens: response cap; None (default) uses the training sampling's.
        temperature: 0 (default) is greedy decoding.
        n: samples per prompt.
        top_p: nucleus mass for sampled validation.
        top_k: top-k for sampled validation (0 disables).
        benchmarks: list of ``dict(name, path, n, temperature, top_p, top_k,
            max_new_tokens, required, fields, default_domain)``; ``name`` and
            ``path`` are required, the sampling keys, ``fields`` and
            ``default_domain`` default to the arguments above, ``required`` lists
            fields every record must have. Names must be unique, without ``/``, and
            must not equal a domain of ``path``.
        fields: record field <- source field for files with other column names, as
            :class:`~gepo_xtuner.data.PromptDataset` takes it (e.g. GSM8K's
            ``dict(prompt='question')``).
        default_domain: the ``domain`` of records that have none (e.g. ``'math'``).

    Raises:
        ValueError: a bad argument (the message names it).
        DataFormatError: a bad record (``FILE:LINE: field ...``).
    """

    def __init__(self, path: str | None = None, interval: int = 10,
                 max_new_tokens: int | None = None, temperature: float = 0.0, n: int = 1,
                 top_p: float = 1.0, top_k: int = 0,
                 benchmarks: Sequence[dict[str, Any]] | None = None,
                 fields: dict[str, str] | None = None,
                 default_domain: str | None = None) -> None:
        if interval < 1:
            raise ValueError(f'val interval must be >= 1, got {interval}')
        if not path and not benchmarks:
            raise ValueError("val needs path='val.jsonl' (one file, metrics per domain) or "
                             "benchmarks=[dict(name='aime25', path='aime25.jsonl'), ...]")
        self.interval = interval
        defaults = dict(n=n, temperature=temperature, top_p=top_p, top_k=top_k,
                        max_new_tokens=max_new_tokens)
        self.read = dict(fields=fields, default_domain=default_domain)
        self.sets: list[ValSet] = []
        if path:
            self.sets.append(self._build(None, path, defaults, 'val', self.read))
        if benchmarks is not None and not isinstance(benchmarks, (list, tuple)):
            raise ValueError(f'val.benchmarks must be a list of dicts, got '
                             f'{type(benchmarks).__name__}')
        for i, bench in enumerate(benchmarks or ()):
            self.sets.append(self._bench(i, bench, defaults))
        self.groups: list[str] = []
        for vs in self.sets:
            for group in vs.groups():
                if group in self.groups:
                    raise ValueError(f'val: two metrics would be named val/{group}/acc; rename the '
                                     f'benchmark {group!r} (benchmark names must differ from '
                                     'each other and from the domains of val.path)')
                self.groups.append(group)

    def _bench(self, i: int, bench: Any, defaults: dict[str, Any]) -> ValSet:
        name, path, options, read = self.check_benchmark(i, bench, defaults, self.read)
        return self._build(name, path, options, f'val.benchmarks[{i}] ({name})', read)

    @staticmethod
    def check_benchmark(i: int, bench: Any, defaults: dict[str, Any] | None = None,
                        read: dict[str, Any] | None = None
                        ) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
        """Checks one ``benchmarks`` entry without reading its file.

        Returns:
            ``(name, path, sampling options over defaults, how to read the file)``;
            the last is ``dict(required, fields, default_domain)``, the entry's
            ``fields`` / ``default_domain`` over ``read``'s.

        Raises:
            ValueError: naming the entry and the key to change.
        """
        defaults = defaults or dict(n=1, temperature=0.0, top_p=1.0, top_k=0,
                                    max_new_tokens=None)
        where = f'val.benchmarks[{i}]'
        if not isinstance(bench, dict):
            raise ValueError(f'{where} must be dict(name=..., path=...), got {bench!r}')
        unknown = sorted(set(bench) - set(BENCHMARK_KEYS))
        if unknown:
            raise ValueError(f'{where} does not take {unknown}; it takes {list(BENCHMARK_KEYS)}')
        name, path = bench.get('name'), bench.get('path')
        if not isinstance(name, str) or not name or '/' in name or name != name.strip():
            raise ValueError(f'{where}.name must be a non-empty string without "/" or '
                             f'surrounding spaces (it becomes val/<name>/acc), got {name!r}')
        if not isinstance(path, str) or not path:
            raise ValueError(f'{where}.path must be a data file, got {path!r}')
        options = {**defaults, **{k: v for k, v in bench.items() if k in defaults}}
        how = {'fields': None, 'default_domain': None, **(read or {})}
        how.update({k: bench[k] for k in ('fields', 'default_domain') if k in bench})
        return name, path, options, dict(required=tuple(bench.get('required') or ()), **how)

    @staticmethod
    def _build(name: str | None, path: str, options: dict[str, Any], where: str,
               read: dict[str, Any]) -> ValSet:
        try:  # check the sampling options now, not at the first validation
            SamplingParams(**{**options, 'max_new_tokens': options['max_new_tokens'] or 1})
        except (TypeError, ValueError) as exc:
            raise ValueError(f'{where}: {exc}') from None
        try:
            records = load_records(path, **read)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, DataFormatError):
                raise
            raise ValueError(f'{where}: {exc}') from None  # a malformed fields / default_domain
        return ValSet(name, records, **options)

    def run(self, rollout: RolloutBackend, rewards: RewardRouter, tokenizer: Any,
            encode_requests: Callable[[list[dict]], list[RolloutRequest]],
            sampling: SamplingParams) -> dict[str, float]:
        """Samples and scores every file on every rank.

        Args:
            rollout: the training run's backend (called once per file, also with no
                records: its ``generate`` may be collective).
            rewards: the run's per-domain rewards.
            tokenizer: decodes the responses.
            encode_requests: records -> rollout requests (the run's prompt encoding).
            sampling: the training sampling (its length cap and stop tokens are the
                defaults here).

        Returns:
            ``val/<group>/acc`` for each domain (single-file form) or benchmark, and
            ``val/acc``.
        """
        world = dist_world_size()
        rank = dist_rank()
        sums = torch.zeros(len(self.groups), 2, dtype=torch.float64)  # reward sum, samples
        for vs in self.sets:
            records = vs.records[rank::world]
            params = SamplingParams(
                n=vs.n, temperature=vs.temperature, top_p=vs.top_p, top_k=vs.top_k,
                max_new_tokens=vs.max_new_tokens or sampling.max_new_tokens,
                stop_token_ids=sampling.stop_token_ids)
            scored = sample_and_score(rollout, tokenizer, rewards, records,
                                      encode_requests(records), params)
            index = torch.tensor([self.groups.index(vs.group_of(r)) for r in records],
                                 dtype=torch.long)
            per_record = torch.stack([scored.rewards.double().sum(1),
                                      torch.full((len(records), ), float(vs.n),
                                                 dtype=torch.float64)], 1)
            sums.index_add_(0, index, per_record)
        sums = all_reduce_sum(sums)  # on the device the process group serves
        acc = (sums[:, 0] / sums[:, 1].clamp_min(1)).tolist()
        metrics = {f'val/{g}/acc': a for g, a in zip(self.groups, acc, strict=True)}
        metrics['val/acc'] = sum(acc) / len(acc)
        return metrics
