"""Run-health checks of the per-step metrics the RL loop logs.

Each check reads one step's metric row (``{'step': 12.0, 'reward/mean/add': 0.4, ...}``,
the row the loop appends to its history) and returns the :class:`Finding` s whose
condition holds at that step. The checks are not pure functions of one row: each is a
small deterministic state machine that keeps the little state its condition needs
(running windows, start levels, counters) in its own attributes, so its findings at a
step are a function of the rows it has observed, and it has ``state_dict()`` /
``load_state_dict()``, so a resumed run decides exactly as an uninterrupted one. The
module itself does no I/O, no logging and keeps no global mutable state
(``tests/test_analysis/test_health_module.py``):
:class:`~gepo_xtuner.engine.runtime.health_hook.RunHealthHook` is the glue that feeds the rows,
prints new alarms, logs ``health/<alarm>`` and stops a run on request.

The checks and the metrics they read:

=====================  ===============================================================
alarm                  metrics
=====================  ===============================================================
``length_collapse``    ``response/length/<d>`` (with ``reward/mean/<d>``, ``val/<d>/acc``)
``entropy_collapse``   ``entropy/group_nll/<d>``, ``entropy/policy/<d>``
``entropy_runaway``    the same
``gepo_silent``        ``shaping/frac_damped_pos|neg`` when a shaper's band (``band/low|high``)
                       is logged, ``adv/frac_zero``
``gepo_saturated``     the same
``rollout_mismatch``   ``rollout/logprob_abs_diff``
``clip_saturated``     ``loss/clipfrac``
``reward_without_val`` ``reward/mean[/<d>]`` between validations, ``val/acc``, ``val/<d>/acc``
=====================  ===============================================================

Thresholds are the checks' arguments; their defaults and where they come from are in
docs/training.md ("Run health").
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..advantage.base import BAND_KEYS

Row = Mapping[str, float]

__all__ = ['Finding', 'HealthCheck', 'LengthCollapse', 'EntropyBounds', 'GEPOBandActivity',
           'LogprobMismatch', 'ClipFraction', 'RewardWithoutValidation', 'CHECKS',
           'build_checks', 'next_active']


@dataclass(frozen=True)
class Finding:
    """A condition that holds at a step.

    Attributes:
        alarm: the alarm's name, e.g. ``'length_collapse'`` (metric ``health/<alarm>``).
        domain: the domain it concerns, or ``'all'`` for the whole batch.
        message: the figures that triggered it and what to try (one line).
    """

    alarm: str
    domain: str
    message: str


def _domains(row: Row, prefix: str) -> list[str]:
    """Names ``d`` of the keys ``<prefix><d>`` of a row (one level, finite values)."""
    return sorted(k[len(prefix):] for k, v in row.items()
                  if k.startswith(prefix) and '/' not in k[len(prefix):]
                  and isinstance(v, (int, float)) and math.isfinite(v))


def _val_key(domain: str) -> str:
    return 'val/acc' if domain == 'all' else f'val/{domain}/acc'


def _fmt(value: float | None) -> str:
    return 'n/a' if value is None or not math.isfinite(value) else f'{value:.3g}'


class HealthCheck(abc.ABC):
    """One alarm family: ``observe`` a step's row, return the findings holding now.

    Subclasses keep their state in plain Python containers and list its attribute
    names in ``state_keys``; ``state_dict()`` / ``load_state_dict()`` copy those.
    """

    #: the alarm names this check can raise (metrics ``health/<alarm>``)
    alarms: ClassVar[tuple[str, ...]] = ()
    state_keys: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def observe(self, step: int, row: Row) -> list[Finding]:
        """The findings whose condition holds after step ``step`` (metrics ``row``)."""

    def state_dict(self) -> dict[str, Any]:
        return {k: _copy(getattr(self, k)) for k in self.state_keys}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for k in self.state_keys:
            if k in state:
                setattr(self, k, _copy(state[k]))


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy(v) for v in value]
    return value


def _positive(name: str, value: float, upper: float | None = None) -> float:
    if not (value > 0 and (upper is None or value <= upper)):
        bound = f'in (0, {upper}]' if upper is not None else '> 0'
        raise ValueError(f'{name} must be {bound}, got {value!r}')
    return float(value)


def _count(name: str, value: int) -> int:
    if not (isinstance(value, int) and value >= 1):
        raise ValueError(f'{name} must be an integer >= 1, got {value!r}')
    return value


class LengthCollapse(HealthCheck):
    """A domain's mean response length fell far below its peak within a window.

    With ``L_t`` the mean of ``response/length/<d>`` over the last ``smooth`` steps and
    ``P_t`` its maximum over the last ``window`` steps, the alarm holds when
    ``L_t < (1 - drop) * P_t`` and ``P_t - L_t >= min_tokens``, whatever the reward did
    (a reward that pays for brevity is the usual hack: the paper's "length collapse",
    section 2.3). The line says what the domain's training reward and validation did
    between the peak and now.

    Args:
        drop: the fall, as a share of the peak, that raises the alarm.
        window: steps over which the peak is taken.
        smooth: steps averaged into one length value (1: the step's own).
        min_tokens: smallest fall in tokens that counts (very short answers are noisy).
    """

    alarms = ('length_collapse', )
    state_keys = ('recent', 'vals')

    def __init__(self, drop: float = 0.5, window: int = 20, smooth: int = 3,
                 min_tokens: float = 2.0) -> None:
        self.drop = _positive('length_collapse.drop', drop, 1.0)
        self.window = _count('length_collapse.window', window)
        self.smooth = _count('length_collapse.smooth', smooth)
        self.min_tokens = float(min_tokens)
        self.recent: dict[str, list[list[float]]] = {}  # d -> [[step, raw, smoothed, reward]]
        self.vals: dict[str, list[list[float]]] = {}  # d -> [[step, val]] (recent ones)

    def observe(self, step: int, row: Row) -> list[Finding]:
        for key, value in row.items():  # validation per domain: val/<d>/acc
            if key.startswith('val/') and key.endswith('/acc') and math.isfinite(value):
                d = key[4:-4] or 'all'
                self.vals.setdefault(d, []).append([float(step), float(value)])
                self.vals[d] = self.vals[d][-50:]
        out = []
        for d in _domains(row, 'response/length/'):
            hist = self.recent.setdefault(d, [])
            raw = float(row[f'response/length/{d}'])
            last = [h[1] for h in hist[-(self.smooth - 1):]] if self.smooth > 1 else []
            smoothed = (sum(last) + raw) / (len(last) + 1)
            hist.append([float(step), raw, smoothed, float(row.get(f'reward/mean/{d}', math.nan))])
            del hist[:-self.window]
            peak = max(hist, key=lambda h: h[2])
            if smoothed < (1 - self.drop) * peak[2] and peak[2] - smoothed >= self.min_tokens:
                out.append(Finding('length_collapse', d, self._message(d, hist, peak, smoothed)))
        return out

    def _message(self, d: str, hist: list[list[float]], peak: list[float],
                 now: float) -> str:
        since = [h for h in hist if h[0] >= peak[0]]
        vals = [v for v in self.vals.get(d, []) if v[0] >= peak[0] - 1e-9]
        val = (f'{_val_key(d)} {vals[0][1]:.3f} (step {int(vals[0][0])}) -> {vals[-1][1]:.3f} '
               f'(step {int(vals[-1][0])})' if len(vals) >= 2 else
               f'{_val_key(d)} {vals[0][1]:.3f} at step {int(vals[0][0])}' if vals else
               'no validation in the window')
        return (f'mean response length {now:.1f} tokens, {1 - now / peak[2]:.0%} below its '
                f'peak {peak[2]:.1f} at step {int(peak[0])} (drop > {self.drop:.0%} within '
                f'{self.window} steps); meanwhile reward/mean/{d} {_fmt(since[0][3])} -> '
                f'{_fmt(since[-1][3])}, {val}. Try: check that the reward does not pay for '
                'short answers (tools/evaluate.py on a few records), keep GEPO\'s '
                'alpha_high < alpha_low, lower the learning rate or raise kl_coef')


class EntropyBounds(HealthCheck):
    """A domain's entropy left ``[low, high]`` times its level at the start.

    The start level of each metric and domain is the mean of its first ``start_steps``
    values; the current level the mean of its last ``smooth`` values. Collapse:
    ``now < low * start``; runaway: ``now > high * start``; either only when
    ``|now - start| >= min_change`` nats (small levels are noisy in ratio).

    Args:
        low, high: the bounds relative to the start level.
        start_steps: steps averaged into the start level.
        smooth: steps averaged into the current level.
        min_change: smallest absolute change in nats that counts.
        metrics: the per-domain metric prefixes watched.
    """

    alarms = ('entropy_collapse', 'entropy_runaway')
    state_keys = ('start', 'recent')

    def __init__(self, low: float = 0.1, high: float = 3.0, start_steps: int = 5,
                 smooth: int = 3, min_change: float = 0.1,
                 metrics: Iterable[str] = ('entropy/group_nll', 'entropy/policy')) -> None:
        self.low = _positive('entropy.low', low, 1.0)
        self.high = _positive('entropy.high', high)
        if self.high <= 1:
            raise ValueError(f'entropy.high must be > 1, got {high!r}')
        self.start_steps = _count('entropy.start_steps', start_steps)
        self.smooth = _count('entropy.smooth', smooth)
        self.min_change = float(min_change)
        self.metrics = tuple(metrics)
        self.start: dict[str, list[float]] = {}  # key -> first start_steps values
        self.recent: dict[str, list[float]] = {}  # key -> last smooth values

    def observe(self, step: int, row: Row) -> list[Finding]:
        out = []
        for metric in self.metrics:
            for d in _domains(row, metric + '/'):
                key = f'{metric}/{d}'
                value = float(row[key])
                first = self.start.setdefault(key, [])
                recent = self.recent.setdefault(key, [])
                recent.append(value)
                del recent[:-self.smooth]
                if len(first) < self.start_steps:
                    first.append(value)
                    continue
                start = sum(first) / len(first)
                now = sum(recent) / len(recent)
                if abs(now - start) < self.min_change:
                    continue
                for alarm, hit, bound in (('entropy_collapse', now < self.low * start, self.low),
                                          ('entropy_runaway', now > self.high * start, self.high)):
                    if hit:
                        try_ = ('raise the sampling temperature or lower the learning rate; '
                                'GEPO: a larger alpha_high keeps more negative signal'
                                if alarm == 'entropy_collapse' else
                                'lower the learning rate, raise kl_coef; check for reward '
                                'errors (reward/errors/<domain>)')
                        out.append(Finding(alarm, d, (
                            f'{key} {now:.3f} is {now / start:.2f}x its start level {start:.3f} '
                            f'(mean of the first {self.start_steps} steps; bound {bound:g}x). '
                            f'Try: {try_}')))
        return out


class GEPOBandActivity(HealthCheck):
    """A shaper's entropy band never reached on a side, or damping nearly every signal.

    Watched on steps that log a band (``band/low``, ``band/high``: the loop logs any
    shaper's band under these names, GEPO's ``h_low`` / ``h_high`` among them) and have any
    response with a non-zero advantage (``adv/frac_zero < 1``); a step without one leaves
    the counts, and the alarms they hold, as they are. Silent: a side's damped share
    (``shaping/frac_damped_pos`` for the low side, ``..._neg`` for the high side) is 0 on
    ``silent_steps`` such steps in a row. Saturated: the damped share of the responses
    that carry signal, ``(pos + neg) / (1 - frac_zero)``, is at least
    ``saturated_share`` on ``saturated_steps`` steps in a row.

    A group is damped on one side only (its positive advantages below the band, its
    negative ones above it), and with a mean-centred estimator (GRPO, Dr.GRPO, RLOO) a
    group with signal holds both signs, so with ``K`` responses per prompt the share is
    at most ``(K - 1) / K`` (0.75 at K=4, 0.875 at K=8): every group with signal outside
    the band on the side of its majority, with one response of the other sign. The
    default 0.7 can be reached from K=4 on (0.9 would need K >= 10); normal runs of the
    shipped K=8 configs damped about half of these responses, at most 0.76 on a single
    step (docs/training.md, "Run health").

    Args:
        silent_steps: steps without damping on a side that raise ``gepo_silent``.
        saturated_share: damped share of signal-carrying responses that counts as saturated.
        saturated_steps: saturated steps in a row that raise ``gepo_saturated``.
    """

    alarms = ('gepo_silent', 'gepo_saturated')
    state_keys = ('quiet', 'full')

    def __init__(self, silent_steps: int = 20, saturated_share: float = 0.7,
                 saturated_steps: int = 5) -> None:
        self.silent_steps = _count('gepo.silent_steps', silent_steps)
        self.saturated_share = _positive('gepo.saturated_share', saturated_share, 1.0)
        self.saturated_steps = _count('gepo.saturated_steps', saturated_steps)
        self.quiet: dict[str, int] = {'low': 0, 'high': 0}
        self.full = 0

    def observe(self, step: int, row: Row) -> list[Finding]:
        low, high = row.get(BAND_KEYS[0]), row.get(BAND_KEYS[1])
        zero = row.get('adv/frac_zero', 0.0)
        if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
            return []
        pos = row.get('shaping/frac_damped_pos', 0.0)
        neg = row.get('shaping/frac_damped_neg', 0.0)
        damped = (pos + neg) / (1 - zero) if zero < 1.0 else math.nan
        # no signal: nothing could be damped, the step says nothing; the counts stay, and
        # so do the alarms they hold
        if zero < 1.0:
            for side, share in (('low', pos), ('high', neg)):
                self.quiet[side] = self.quiet[side] + 1 if share == 0 else 0
            self.full = self.full + 1 if damped >= self.saturated_share else 0
        mean, std = row.get('entropy/group_nll_mean'), row.get('entropy/group_nll_std')
        levels = [row[f'entropy/group_nll/{d}'] for d in _domains(row, 'entropy/group_nll/')]
        spread = (f'batch group entropy {_fmt(mean)} +- {_fmt(std)}'
                  + (f', domain means {min(levels):.3g}..{max(levels):.3g}' if levels else ''))
        band = f'band [{low:.3g}, {high:.3g}]'
        out = []
        for side in ('low', 'high'):
            if self.quiet[side] >= self.silent_steps:
                what = ('no low-entropy group had its positive advantages damped' if side == 'low'
                        else 'no high-entropy group had its negative advantages damped')
                knob = 'beta_low' if side == 'low' else 'beta_high'
                out.append(Finding('gepo_silent', 'all', (
                    f'side {side}: {what} for {self.quiet[side]} steps; {band}, {spread}. '
                    f'The band is out of the batch\'s reach on that side: lower {knob} '
                    '(a narrower band) or check that entropies differ between groups')))
        if self.full >= self.saturated_steps:
            out.append(Finding('gepo_saturated', 'all', (
                (f'{damped:.0%}' if zero < 1.0 else
                 f'no signal at this step; before it at least {self.saturated_share:.0%}')
                + ' of the responses with signal damped '
                f'(positive {pos:.3f}, negative {neg:.3f} of all) for {self.full} steps; '
                f'{band}, {spread}. GEPO then scales most of their advantages down: widen '
                'the band (larger beta_low / beta_high) or move alpha_low / alpha_high '
                'towards 1')))
        return out


class _Bound(HealthCheck):
    """A batch-level metric above ``bound`` on ``patience`` steps in a row."""

    metric: ClassVar[str]
    alarm: ClassVar[str]
    advice: ClassVar[str]
    state_keys = ('above', )

    def __init__(self, bound: float, patience: int = 3) -> None:
        self.bound = _positive(f'{self.alarm}.bound', bound)
        self.patience = _count(f'{self.alarm}.patience', patience)
        self.above = 0

    def observe(self, step: int, row: Row) -> list[Finding]:
        value = row.get(self.metric)
        if value is None or not math.isfinite(value):
            return []
        self.above = self.above + 1 if value > self.bound else 0
        if self.above < self.patience:
            return []
        return [Finding(self.alarm, 'all', (
            f'{self.metric} {value:.4g} above {self.bound:g} for {self.above} steps. '
            f'Try: {self.advice}'))]


class LogprobMismatch(_Bound):
    """``rollout/logprob_abs_diff`` (mean |logprob trainer - rollout| per token) too high.

    With generation ahead of the update (``train_cfg.max_staleness=1``) the gap also
    holds one update's change of the policy; on the demo config (60 steps, lr 1e-4, a
    high rate) that was 0.023 per token in the median and 0.052 at most, under the
    default bound, so the alarm still tells a weight push that never arrives (a gap
    that grows with every step) from the intended one-version gap.

    Args:
        bound: nats per token (default 0.1).
        patience: steps in a row above it.
    """

    metric, alarm = 'rollout/logprob_abs_diff', 'rollout_mismatch'
    alarms = ('rollout_mismatch', )
    advice = ('the inference engine and the trainer disagree: check that weights reach '
              'the server after each step, and that both use the same dtype and logprobs '
              'mode (LMDeploy: --logprobs-mode raw_logprobs)')

    def __init__(self, bound: float = 0.1, patience: int = 3) -> None:
        super().__init__(bound, patience)


class ClipFraction(_Bound):
    """``loss/clipfrac`` (share of tokens whose importance weight was clipped) too high.

    Args:
        bound: the share (default 0.2).
        patience: steps in a row above it.
    """

    metric, alarm = 'loss/clipfrac', 'clip_saturated'
    alarms = ('clip_saturated', )
    advice = ('updates move the policy too far per step, or rollouts are stale: lower the '
              'learning rate or ppo_epochs, use fewer optimizer steps per rollout batch; '
              'see also rollout_mismatch')

    def __init__(self, bound: float = 0.2, patience: int = 3) -> None:
        super().__init__(bound, patience)


class RewardWithoutValidation(HealthCheck):
    """Training reward rising while validation falls over ``validations`` validations.

    At each validation of a key (``val/acc`` for ``'all'``, ``val/<d>/acc`` per domain),
    the mean training reward (``reward/mean`` or ``reward/mean/<d>``) of the steps since
    the previous validation is recorded. The alarm holds when validation fell at each of
    the last ``validations`` validations, by at least ``min_drop`` in all, while the
    interval reward rose by at least ``min_rise`` from the first of those intervals to
    the last.

    Args:
        validations: consecutive falling validations that raise the alarm.
        min_drop: smallest total fall of validation accuracy.
        min_rise: smallest rise of the interval training reward.
    """

    alarms = ('reward_without_val', )
    state_keys = ('sums', 'evals')

    def __init__(self, validations: int = 3, min_drop: float = 0.05,
                 min_rise: float = 0.02) -> None:
        self.validations = _count('reward_without_val.validations', validations)
        self.min_drop = float(min_drop)
        self.min_rise = float(min_rise)
        self.sums: dict[str, list[float]] = {}  # d -> [reward sum, steps] since last val
        self.evals: dict[str, list[list[float]]] = {}  # d -> [[step, val, interval reward]]

    def observe(self, step: int, row: Row) -> list[Finding]:
        for d in ['all', *_domains(row, 'reward/mean/')]:
            value = row.get('reward/mean' if d == 'all' else f'reward/mean/{d}')
            if value is not None and math.isfinite(value):
                acc = self.sums.setdefault(d, [0.0, 0.0])
                acc[0] += value
                acc[1] += 1
        out = []
        for key, value in sorted(row.items()):
            if not (key.startswith('val/') and key.endswith('/acc') and math.isfinite(value)):
                continue
            d = key[4:-4] or 'all'
            acc = self.sums.pop(d, [0.0, 0.0])
            reward = acc[0] / acc[1] if acc[1] else math.nan
            evals = self.evals.setdefault(d, [])
            evals.append([float(step), float(value), reward])
            del evals[:-(self.validations + 1)]
            if len(evals) <= self.validations:
                continue
            vals = [e[1] for e in evals]
            falling = all(b < a for a, b in zip(vals, vals[1:]))
            r_first, r_last = evals[1][2], evals[-1][2]
            rising = math.isfinite(r_first) and math.isfinite(r_last) and \
                r_last - r_first >= self.min_rise
            if falling and vals[0] - vals[-1] >= self.min_drop and rising:
                reward_key = 'reward/mean' if d == 'all' else f'reward/mean/{d}'
                out.append(Finding('reward_without_val', d, (
                    f'{key} fell {vals[0]:.3f} -> {vals[-1]:.3f} over {self.validations} '
                    f'validations (steps {int(evals[0][0])}-{int(evals[-1][0])}) while '
                    f'{reward_key} rose {r_first:.3f} -> {r_last:.3f}. The policy learns '
                    'what the reward pays for, not the task: check the verifier on its '
                    'high-reward samples, the train/validation split and the answer format')))
        return out


#: config name -> check class (the hook's ``checks`` argument uses these names)
CHECKS: dict[str, type[HealthCheck]] = {
    'length_collapse': LengthCollapse,
    'entropy': EntropyBounds,
    'gepo': GEPOBandActivity,
    'rollout_mismatch': LogprobMismatch,
    'clip': ClipFraction,
    'reward_without_val': RewardWithoutValidation,
}


def build_checks(checks: Mapping[str, Mapping[str, Any] | None]) -> dict[str, HealthCheck]:
    """Checks from ``{name: kwargs}``; ``None`` for a name switches that check off.

    Every name of :data:`CHECKS` not given is built with its defaults.

    Raises:
        ValueError: an unknown check name or argument (names the valid ones).
    """
    unknown = set(checks) - set(CHECKS)
    if unknown:
        raise ValueError(f'unknown health check(s) {sorted(unknown)}; valid: {sorted(CHECKS)} '
                         '(None switches one off)')
    out = {}
    for name, cls in CHECKS.items():
        kwargs = checks.get(name, {})
        if kwargs is None:
            continue
        try:
            out[name] = cls(**dict(kwargs))
        except TypeError as err:
            raise ValueError(f'health check {name!r}: {err}') from None
    return out


def next_active(active: set[tuple[str, str]], findings: Iterable[Finding],
                row: Row) -> tuple[set[tuple[str, str]], list[Finding]]:
    """The alarms holding after a step, and the findings that start an alarm.

    An alarm ``(alarm, domain)`` holds while its condition is found. A domain that is not
    in the step's batch (no metric of the row ends in ``/<domain>``) says nothing about its
    alarms, so they keep holding: with few prompts per step a domain is often absent, and
    its alarm must not be raised again each time it comes back.

    Args:
        active: ``(alarm, domain)`` pairs holding before the step.
        findings: the checks' findings at the step.
        row: the step's metrics.

    Returns:
        ``(active after the step, findings of alarms that were not holding)``.
    """
    findings = list(findings)
    found = {(f.alarm, f.domain) for f in findings}
    absent = {(a, d) for a, d in active
              if d != 'all' and not any(k.endswith('/' + d) for k in row)}
    new, seen = [], set()
    for f in findings:
        key = (f.alarm, f.domain)
        if key not in active and key not in seen:
            new.append(f)
            seen.add(key)
    return found | absent, new
