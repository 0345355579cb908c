"""Validation during training: held-out files scored every few steps, across ranks."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from ...data.records import DataFormatError, load_records
from ...ops.distributed import all_reduce_sum, dist_rank, dist_world_size
from ...reward import RewardRouter
from ...rollout import RolloutBackend, RolloutRequest, SamplingParams
from ...settings import check_types, docstring_attributes, field_defaults, refuse_unknown
from .scoring import sample_and_score


@dataclass(frozen=True)
class ValSampling:
    """How validation samples: overrides of the training
    :class:`~gepo_xtuner.rollout.SamplingParams` (its stop ids, and its length cap where
    ``max_new_tokens`` is None).

    Attributes:
        n: samples per prompt.
        temperature: 0 (default) is greedy decoding.
        top_p: nucleus mass for sampled validation.
        top_k: top-k for sampled validation (0 disables).
        max_new_tokens: response cap; None (default): the training sampling's.
    """

    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:  # SamplingParams' own checks, now
        self.params(SamplingParams(max_new_tokens=self.max_new_tokens or 1))

    def params(self, training: SamplingParams) -> SamplingParams:
        """The sampling parameters over ``training``'s stop ids and length cap."""
        return SamplingParams(n=self.n, temperature=self.temperature, top_p=self.top_p,
                              top_k=self.top_k,
                              max_new_tokens=self.max_new_tokens or training.max_new_tokens,
                              stop_token_ids=training.stop_token_ids)


@dataclass(frozen=True)
class ReadSettings:
    """How a held-out file is read (:func:`~gepo_xtuner.data.records.load_records`).

    Attributes:
        fields: record field <- source field for files with other column names, as
            :class:`~gepo_xtuner.data.PromptDataset` takes it (e.g. GSM8K's
            ``dict(prompt='question')``).
        default_domain: the ``domain`` of records that have none (e.g. ``'math'``).
        required: fields every record must have (benchmarks only).
    """

    fields: dict | None = None
    default_domain: str | None = None
    required: tuple[str, ...] = ()

    def load(self, path: str) -> list[dict[str, Any]]:
        """The validated records of ``path``."""
        return load_records(path, fields=self.fields, default_domain=self.default_domain,
                            required=self.required)


@dataclass(frozen=True)
class Benchmark:
    """One ``train_cfg.val.benchmarks`` entry, checked (its file is read by
    :class:`Validator`).

    Attributes:
        name: the metric's name, ``val/<name>/acc``: non-empty, without ``/``.
        path: the data file.
        sampling: the entry's sampling keys over ``val``'s.
        read: the entry's ``fields`` / ``default_domain`` over ``val``'s, and its
            ``required`` fields.
    """

    name: str
    path: str
    sampling: ValSampling
    read: ReadSettings

    @classmethod
    def from_dict(cls, i: int, bench: Any, sampling: ValSampling, read: ReadSettings
                  ) -> 'Benchmark':
        """Checks entry ``i`` (keys: ``name``, ``path``, :class:`ValSampling`'s and
        :class:`ReadSettings`' fields) over ``val``'s ``sampling`` and ``read``.

        Raises:
            ValueError: naming the entry and the key to change.
        """
        where = f'val.benchmarks[{i}]'
        if not isinstance(bench, Mapping):
            raise ValueError(f'{where} must be dict(name=..., path=...), got {bench!r}')
        keys = benchmark_keys()
        unknown = sorted(set(bench) - set(keys))
        if unknown:
            raise ValueError(f'{where} does not take {unknown}; it takes {keys}')
        name, path = bench.get('name'), bench.get('path')
        if not isinstance(name, str) or not name or '/' in name or name != name.strip():
            raise ValueError(f'{where}.name must be a non-empty string without "/" or '
                             f'surrounding spaces (it becomes val/<name>/acc), got {name!r}')
        if not isinstance(path, str) or not path:
            raise ValueError(f'{where}.path must be a data file, got {path!r}')
        try:
            own = replace(sampling, **_pick(ValSampling, bench))
        except (TypeError, ValueError) as exc:
            raise ValueError(f'{where} ({name}): {exc}') from None
        how = replace(read, **_pick(ReadSettings, bench))
        return cls(name, path, own, replace(how, required=tuple(how.required or ())))


@dataclass(frozen=True)
class ValSettings:
    """``train_cfg.val``, checked: held-out files and how to sample on them.

    Two forms, which can be combined:

    * ``val=dict(path='val.jsonl', interval=10)``: one file, greedy by default, logged
      per domain as ``val/<domain>/acc``;
    * ``val=dict(interval=10, benchmarks=[dict(name='aime25', path=..., n=4,
      temperature=0.6), ...])``: one metric per benchmark, ``val/<name>/acc``.

    The config is flat: :class:`ValSampling`'s keys (``n``, ``temperature``, ``top_p``,
    ``top_k``, ``max_new_tokens``) and :class:`ReadSettings`' (``fields``,
    ``default_domain``) sit beside ``path`` and ``interval``; a benchmark entry
    overrides them for itself.

    Attributes:
        interval: validate every ``interval`` steps (>= 1), before the first and after
            the last.
        path: a held-out file (JSONL or Parquet, :mod:`gepo_xtuner.data.records` schema),
            metrics per domain; None: benchmarks only.
        benchmarks: the checked ``benchmarks`` entries (:class:`Benchmark`); names unique.
        sampling: the sampling of ``path`` and the default of each benchmark.
        read: how ``path`` is read and the default of each benchmark.
    """

    interval: int = 10
    path: str | None = None
    benchmarks: tuple[Benchmark, ...] = ()
    sampling: ValSampling = field(default_factory=ValSampling)
    read: ReadSettings = field(default_factory=ReadSettings)

    @classmethod
    def keys(cls) -> list[str]:
        """The keys ``train_cfg.val`` takes."""
        return ['interval', 'path', 'benchmarks', *_names(ValSampling), 'fields',
                'default_domain']

    @classmethod
    def help(cls) -> dict[str, str]:
        """``key -> help text``, from the docstrings of the classes that own the keys."""
        docs = {**docstring_attributes(cls), **docstring_attributes(ValSampling),
                **docstring_attributes(ReadSettings)}
        docs['benchmarks'] = ('list of dict(name, path, ...): one metric val/<name>/acc each; '
                              f'keys {benchmark_keys()}, defaults the ones of val')
        return {key: docs.get(key, '') for key in cls.keys()}

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """``key -> default`` as the config writes it."""
        return {'interval': 10, 'path': None, 'benchmarks': None,
                **field_defaults(ValSampling), **field_defaults(ReadSettings)}

    @classmethod
    def from_dict(cls, val: Any) -> 'ValSettings':
        """Checks ``train_cfg.val`` (without reading its files).

        Raises:
            TypeError: an unknown key (with the closest one) or a value of the wrong type.
            ValueError: a bad value, naming the key.
        """
        if not isinstance(val, Mapping):
            raise TypeError(f'train_cfg.val must be a dict (path=..., interval=...), got {val!r}')
        refuse_unknown('train_cfg.val', val, cls.keys())
        check_types('train_cfg.val', ValSampling, _pick(ValSampling, val))
        check_types('train_cfg.val', cls, {k: val[k] for k in ('interval', 'path') if k in val})
        interval = val.get('interval', 10)
        if interval < 1:
            raise ValueError(f'val interval must be >= 1, got {interval}')
        path, benchmarks = val.get('path'), val.get('benchmarks')
        if not path and not benchmarks:
            raise ValueError("val needs path='val.jsonl' (one file, metrics per domain) or "
                             "benchmarks=[dict(name='aime25', path='aime25.jsonl'), ...]")
        if benchmarks is not None and not isinstance(benchmarks, (list, tuple)):
            kind = 'dict' if isinstance(benchmarks, Mapping) else type(benchmarks).__name__
            raise ValueError(f'val.benchmarks must be a list of dicts, got a {kind}')
        try:
            sampling = ValSampling(**_pick(ValSampling, val))
        except ValueError as exc:
            raise ValueError(f'val: {exc}') from None
        read = ReadSettings(**_pick(ReadSettings, val, ('fields', 'default_domain')))
        benches = tuple(Benchmark.from_dict(i, b, sampling, read)
                        for i, b in enumerate(benchmarks or ()))
        names = [b.name for b in benches]
        for name in names:
            if names.count(name) > 1:
                raise duplicate_metric(name)
        return cls(interval, path or None, benches, sampling, read)


def duplicate_metric(name: str) -> ValueError:
    """The refusal of two validation metrics named ``val/<name>/acc``."""
    return ValueError(f'val: two metrics would be named val/{name}/acc; rename the benchmark '
                      f'{name!r} (benchmark names must differ from each other and from the '
                      'domains of val.path)')


def benchmark_keys() -> list[str]:
    """The keys of one ``benchmarks`` entry."""
    return ['name', 'path', *_names(ValSampling), *_names(ReadSettings)]


def _names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def _pick(cls: type, values: Mapping[str, Any], names: Sequence[str] | None = None
          ) -> dict[str, Any]:
    """The entries of ``values`` that are fields of ``cls`` (or of ``names``)."""
    names = _names(cls) if names is None else names
    return {k: values[k] for k in names if k in values}


@dataclass
class ValSet:
    """One held-out file and how to sample on it.

    Attributes:
        name: the benchmark's metric name, or None for the single-file form, whose
            metrics are per domain.
        records: the validated records.
        sampling: how to sample on it.
    """

    name: str | None
    records: list[dict[str, Any]]
    sampling: ValSampling

    def groups(self) -> list[str]:
        """Metric names this set logs (``val/<group>/acc``)."""
        return sorted({r['domain'] for r in self.records}) if self.name is None else [self.name]

    def group_of(self, record: dict[str, Any]) -> str:
        return record['domain'] if self.name is None else self.name


class Validator:
    """Scores the policy on held-out files every ``interval`` steps (``train_cfg.val``,
    whose forms :class:`ValSettings` describes).

    ``val/<x>/acc`` is the mean reward over all of its records and their ``n``
    samples (accuracy for 0/1 rewards; avg@n for ``n > 1``), and ``val/acc`` the
    mean of the ``val/<x>/acc`` values. Each rank takes every world-size-th record
    of each file; sums and counts are all-reduced, so every rank logs the same
    values. The rollout backend is called once per file on every rank, also with no
    records, because some backends' ``generate`` is collective.

    Args:
        settings: the checked ``train_cfg.val`` (:meth:`ValSettings.from_dict`); the
            files are read here.

    Raises:
        ValueError: two metrics of one name (a benchmark named like a domain of ``path``).
        DataFormatError: a bad record (``FILE:LINE: field ...``).
    """

    def __init__(self, settings: ValSettings) -> None:
        self.settings = settings
        self.interval = settings.interval
        self.sets: list[ValSet] = []
        if settings.path:
            self.sets.append(ValSet(None, _read(settings.read, settings.path, 'val'),
                                    settings.sampling))
        for i, bench in enumerate(settings.benchmarks):
            self.sets.append(ValSet(bench.name, _read(
                bench.read, bench.path, f'val.benchmarks[{i}] ({bench.name})'), bench.sampling))
        self.groups: list[str] = []
        for vs in self.sets:
            for group in vs.groups():
                if group in self.groups:  # a benchmark named like a domain of val.path
                    raise duplicate_metric(group)
                self.groups.append(group)

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
            params = vs.sampling.params(sampling)
            scored = sample_and_score(rollout, tokenizer, rewards, records,
                                      encode_requests(records), params)
            index = torch.tensor([self.groups.index(vs.group_of(r)) for r in records],
                                 dtype=torch.long)
            per_record = torch.stack([scored.rewards.double().sum(1),
                                      torch.full((len(records), ), float(vs.sampling.n),
                                                 dtype=torch.float64)], 1)
            sums.index_add_(0, index, per_record)
        sums = all_reduce_sum(sums)  # on the device the process group serves
        acc = (sums[:, 0] / sums[:, 1].clamp_min(1)).tolist()
        metrics = {f'val/{g}/acc': a for g, a in zip(self.groups, acc, strict=True)}
        metrics['val/acc'] = sum(acc) / len(acc)
        return metrics


def _read(read: ReadSettings, path: str, where: str) -> list[dict[str, Any]]:
    """The records of one file; a malformed ``fields`` / ``default_domain`` names ``where``."""
    try:
        return read.load(path)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, DataFormatError):
            raise
        raise ValueError(f'{where}: {exc}') from None
