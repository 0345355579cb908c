"""Load, validate and replay a JSONL rollout dump through an advantage processor.

Input: one response per line, at least::

    {"step": 0, "prompt_id": "q17", "domain": "math", "reward": 1.0,
     "logprobs": [-0.12, -1.3, ...]}

``logprobs`` are the log-probabilities of the sampled response tokens (its length
is the response length). Lines are grouped by ``(step, prompt_id)``; steps are
replayed in increasing order, carrying the processor's state (GEPO's threshold
band) from step to step, exactly as a training run would.
"""

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..advantage import AdvantageProcessor, AdvantageInputs
from ..ops.segment import moments

LOGPROB_TOLERANCE = 1e-3  # engines may return tiny positive values from rounding


class RolloutFormatError(ValueError):
    """A rollout file is unusable; the message starts with ``path:line:``."""


@dataclass
class RolloutTable:
    """Columns of a validated rollout file, one row per response (file order).

    Attributes:
        path: the file read.
        line_numbers: 1-based line number of each row.
        steps, rewards: per row.
        prompt_ids, domains: per row.
        logprobs: per row, float32 arrays of varying length.
        domain_names: distinct domains, first-seen order.
    """

    path: Path
    line_numbers: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    prompt_ids: list[str] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    logprobs: list[np.ndarray] = field(default_factory=list)

    @property
    def domain_names(self) -> list[str]:
        return list(dict.fromkeys(self.domains))

    def __len__(self) -> int:
        return len(self.steps)


def _fail(path: Path, line: int, message: str) -> RolloutFormatError:
    return RolloutFormatError(f'{path}:{line}: {message}')


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _parse_line(path: Path, lineno: int, text: str) -> tuple[int, str, str, float, np.ndarray]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(path, lineno, f'not valid JSON ({exc.msg} at column {exc.colno})') from None
    if not isinstance(obj, dict):
        raise _fail(path, lineno, f'expected a JSON object, got {type(obj).__name__}')
    missing = [k for k in ('step', 'prompt_id', 'domain', 'reward', 'logprobs') if k not in obj]
    if missing:
        raise _fail(path, lineno, f'missing field(s) {missing}; every line needs step, '
                    'prompt_id, domain, reward and logprobs')
    step, prompt_id, domain, reward, lps = (obj[k] for k in ('step', 'prompt_id', 'domain',
                                                             'reward', 'logprobs'))
    if not isinstance(step, int) or isinstance(step, bool):
        raise _fail(path, lineno, f"field 'step' must be an integer, got {step!r}")
    if not isinstance(prompt_id, (str, int)) or isinstance(prompt_id, bool):
        raise _fail(path, lineno, f"field 'prompt_id' must be a string, got {prompt_id!r}")
    if not isinstance(domain, str) or not domain:
        raise _fail(path, lineno, f"field 'domain' must be a non-empty string, got {domain!r}")
    if not _number(reward) or not math.isfinite(reward):
        raise _fail(path, lineno, f"field 'reward' must be a finite number, got {reward!r}")
    if not isinstance(lps, list) or not all(_number(v) for v in lps):
        raise _fail(path, lineno, "field 'logprobs' must be a list of numbers "
                    '(log-probabilities of the sampled response tokens)')
    arr = np.asarray(lps, dtype=np.float64)
    bad = ~np.isfinite(arr) | (arr > LOGPROB_TOLERANCE)
    if bad.any():
        j = int(np.argmax(bad))
        raise _fail(path, lineno, f"field 'logprobs'[{j}] = {lps[j]!r} is not a log-probability "
                    '(must be finite and <= 0)')
    return step, str(prompt_id), domain, float(reward), arr.astype(np.float32)


def load_rollouts(path: str | Path) -> RolloutTable:
    """Reads and validates a rollout JSONL file.

    Blank lines are skipped. All responses of one ``(step, prompt_id)`` group must
    share a domain.

    Raises:
        RolloutFormatError: naming the file and line of the first problem.
        FileNotFoundError: if the file does not exist.
    """
    path = Path(path)
    table = RolloutTable(path=path)
    group_domain: dict[tuple[int, str], tuple[str, int]] = {}
    with path.open(encoding='utf-8') as fh:
        for lineno, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            step, pid, domain, reward, lps = _parse_line(path, lineno, text)
            first = group_domain.setdefault((step, pid), (domain, lineno))
            if first[0] != domain:
                raise _fail(path, lineno, f'domain {domain!r} differs from {first[0]!r} given '
                            f'for the same (step={step}, prompt_id={pid!r}) on line {first[1]}')
            table.line_numbers.append(lineno)
            table.steps.append(step)
            table.prompt_ids.append(pid)
            table.domains.append(domain)
            table.rewards.append(reward)
            table.logprobs.append(lps)
    if not table.steps:
        raise RolloutFormatError(f'{path}:1: no rollouts in the file (it is empty)')
    return table


@dataclass
class Analysis:
    """Per-row results (file order) and per-step thresholds of a replay."""

    advantages: np.ndarray
    raw_advantages: np.ndarray
    group_entropy: np.ndarray
    shaped_low: np.ndarray
    shaped_high: np.ndarray
    thresholds: list[dict[str, Any]]


def _step_rows(table: RolloutTable) -> Iterator[tuple[int, np.ndarray]]:
    steps = np.asarray(table.steps)
    for step in np.unique(steps):
        yield int(step), np.flatnonzero(steps == step)


def analyze_rollouts(table: RolloutTable, processor: AdvantageProcessor) -> Analysis:
    """Replays every step through ``processor``, carrying its state across steps."""
    n = len(table)
    result = Analysis(np.zeros(n), np.zeros(n), np.full(n, np.nan), np.zeros(n, bool),
                      np.zeros(n, bool), [])
    state = processor.init_state()
    domain_index = {d: i for i, d in enumerate(table.domain_names)}
    for step, rows in _step_rows(table):
        pids = [table.prompt_ids[i] for i in rows]
        group_of = {p: g for g, p in enumerate(dict.fromkeys(pids))}
        lengths = [len(table.logprobs[i]) for i in rows]
        logprobs = torch.zeros(len(rows), max(1, max(lengths)))
        for j, i in enumerate(rows):
            logprobs[j, :lengths[j]] = torch.from_numpy(table.logprobs[i])
        mask = torch.arange(logprobs.shape[1])[None, :] < torch.tensor(lengths)[:, None]
        batch = AdvantageInputs(
            rewards=torch.tensor([table.rewards[i] for i in rows], dtype=torch.float64),
            group_ids=torch.tensor([group_of[p] for p in pids]),
            logprobs=logprobs, mask=mask,
            domain_ids=torch.tensor([domain_index[table.domains[i]] for i in rows]),
            domain_names=table.domain_names, prompt_ids=[f'{p} (step {step})' for p in pids])
        out = processor(batch, state)
        result.advantages[rows] = out.advantages.double().numpy()
        result.raw_advantages[rows] = out.raw_advantages.double().numpy()
        result.group_entropy[rows] = out.group_entropy.numpy()
        result.shaped_low[rows] = out.damped_positive.numpy()
        high = out.damped_negative if out.keep is None else out.damped_negative | ~out.keep
        result.shaped_high[rows] = high.numpy()
        band, m = out.band, out.metrics
        if band is not None:  # an entropy-band shaper: the band it used and its statistics
            result.thresholds.append(dict(step=step, h_low=band.low, h_high=band.high,
                                          mu=band.mu, sigma=band.sigma,
                                          num_groups=band.num_groups))
        else:  # no band: the batch's group-entropy statistics
            result.thresholds.append(dict(
                step=step, h_low=None, h_high=None, mu=m['entropy/group_nll_mean'],
                sigma=m['entropy/group_nll_std'], num_groups=int(m['count/groups_with_tokens'])))
    return result


def summarize_domains(table: RolloutTable, analysis: Analysis) -> dict[str, dict[str, Any]]:
    """Per-domain statistics pooled over all steps (population moments).

    Group entropy statistics count each ``(step, prompt_id)`` group with tokens
    once; skewness/kurtosis (excess) are over all responses of the domain.
    """
    names = table.domain_names
    dom = torch.tensor([names.index(d) for d in table.domains])
    d = len(names)
    n, acc, _, _ = moments(torch.tensor(table.rewards), dom, d)
    _, _, skew_b, kurt_b = moments(torch.from_numpy(analysis.raw_advantages), dom, d)
    _, _, skew_a, kurt_a = moments(torch.from_numpy(analysis.advantages), dom, d)
    seen: dict[tuple[int, str], int] = {}
    for i, key in enumerate(zip(table.steps, table.prompt_ids)):
        seen.setdefault(key, i)
    firsts = [i for i in seen.values() if not math.isnan(analysis.group_entropy[i])]
    ent = torch.from_numpy(analysis.group_entropy[firsts])
    g_dom = dom[firsts]
    ng, ent_mean, _, _ = moments(ent, g_dom, d)
    ent_var = torch.zeros(d, dtype=torch.float64).index_add_(
        0, g_dom, (ent - ent_mean[g_dom])**2) / ng.clamp_min(1)
    num_groups = torch.zeros(d).index_add_(0, dom[list(seen.values())], torch.ones(len(seen)))
    low = torch.zeros(d, dtype=torch.float64).index_add_(0, dom, torch.from_numpy(
        analysis.shaped_low).double()) / n
    high = torch.zeros(d, dtype=torch.float64).index_add_(0, dom, torch.from_numpy(
        analysis.shaped_high).double()) / n

    def clean(x: torch.Tensor) -> float | None:
        v = float(x)
        return None if math.isnan(v) else v

    return {
        name: dict(num_responses=int(n[k]), num_groups=int(num_groups[k]),
                   group_entropy_mean=clean(ent_mean[k]),
                   group_entropy_std=clean(ent_var[k].sqrt()) if ng[k] > 0 else None,
                   accuracy=clean(acc[k]),
                   advantage_skewness_before=clean(skew_b[k]),
                   advantage_skewness_after=clean(skew_a[k]),
                   advantage_kurtosis_before=clean(kurt_b[k]),
                   advantage_kurtosis_after=clean(kurt_a[k]),
                   frac_shaped_low=float(low[k]), frac_shaped_high=float(high[k]))
        for k, name in enumerate(names)
    }
