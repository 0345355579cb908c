"""Method comparison over seeds: the paper's Table 1, Table 2 and Figures 3-5 from run histories.

A *history* is what a training run leaves in ``<work_dir>/training_curves.json``
(:class:`~gepo_xtuner.engine.runtime.curves_hook.TrainingCurvesHook`): one dict per RL step with
``step`` and the step's metrics, among them ``val/<domain>/acc`` and ``val/acc`` on
validation steps (step 0 is the starting point), ``entropy/policy`` and
``entropy/group_nll/<domain>``. Everything here is a pure function of histories; the harness
``tools/run_experiments.py`` produces them.

Per run (:func:`summarize_run`):

* ``final``: per-domain validation accuracy at the last validation and their mean;
* ``best``: the same at the validation step with the highest mean (the paper reports
  "the best checkpoint"; the checkpoint is picked on the same held-out set, so ``best`` is
  optimistic by construction, ``final`` is not);
* ``oscillation``: mean absolute change of ``val/acc`` between consecutive validations;
* ``late_drop``: ``best - final`` of the mean (0 when the last validation is the best);
* ``gain_min`` and ``gain_spread``: the smallest per-domain gain ``final - start`` and the
  standard deviation of the gains across domains (0 when every domain gained the same:
  the paper's "balanced improvements");
* policy entropy over the last quarter of steps and its maximum over the run;
* per-domain group entropy over the last quarter of steps, and its ``spread``: the standard
  deviation across domains (0 when every domain sits at the same entropy level).

Over seeds, a value is reported as mean +- sample standard deviation (``ddof=1``). A method
differs from a reference "beyond seed noise" when ``|mean_m - mean_ref| > 2 * se`` with
``se = sqrt(s_m^2 / n_m + s_ref^2 / n_ref)`` (a two-standard-error band, about a 95 % test
for normal seed noise); with one seed on either side no noise estimate exists.
"""

import json
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

from .synthetic_tasks import DOMAINS  # noqa: E402

#: Display names of the methods the harness knows, in table order.
METHOD_LABELS: dict[str, str] = {
    'grpo': 'GRPO', 'aepo': 'AEPO', 'clip_cov': 'Clip-Cov', 'kl_cov': 'KL-Cov', 'gepo': 'GEPO',
    'gepo_wo_low': 'GEPO w/o low', 'gepo_wo_high': 'GEPO w/o high',
    'gepo_symmetric': 'GEPO symmetric'}
#: The ablations of Table 2 (section 3.2), compared with full GEPO.
ABLATIONS: tuple[str, ...] = ('gepo_wo_low', 'gepo_wo_high', 'gepo_symmetric')
#: Fraction of the last steps over which end-of-run entropies are averaged.
TAIL_FRACTION = 0.25


def label(method: str) -> str:
    """The display name of a method (its key when unknown)."""
    return METHOD_LABELS.get(method, method)


def load_history(work_dir: str | Path) -> list[dict]:
    """The per-step history a run wrote to ``training_curves.json`` (None for NaN)."""
    return json.loads((Path(work_dir) / 'training_curves.json').read_text())


def domains_of(history: Sequence[dict]) -> list[str]:
    """Validated domains of a run, the task mix's order first, then any others sorted."""
    found = {k[len('val/'):-len('/acc')] for row in history for k in row
             if k.startswith('val/') and k.endswith('/acc') and k.count('/') == 2}
    return [d for d in DOMAINS if d in found] + sorted(found - set(DOMAINS))


def _num(value) -> float:
    return math.nan if value is None else float(value)


def _tail_mean(history: Sequence[dict], key: str) -> float:
    """Mean of ``key`` over the last :data:`TAIL_FRACTION` of training steps (NaN if absent)."""
    rows = [r for r in history if r.get('step', 0) > 0]
    rows = rows[-max(1, math.ceil(len(rows) * TAIL_FRACTION)):]
    values = [_num(r.get(key)) for r in rows]
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def _spread(values: Sequence[float]) -> float:
    """Population standard deviation (NaN for no values)."""
    if not values:
        return math.nan
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean)**2 for v in values) / len(values))


def summarize_run(history: Sequence[dict]) -> dict:
    """One run's numbers for the tables (see the module docstring).

    Returns:
        ``{"domains", "start", "final", "best", "best_step", "final_step", "oscillation",
        "late_drop", "gain_min", "gain_spread", "entropy_policy_tail", "entropy_policy_max", "group_entropy_tail",
        "group_entropy_spread"}``; ``start``/``final``/``best`` map each domain and
        ``"avg"`` to an accuracy.

    Raises:
        ValueError: if the history has fewer than one validation.
    """
    domains = domains_of(history)
    val = [r for r in history if r.get('val/acc') is not None]
    if not val or not domains:
        raise ValueError('the run has no validation results (val/<domain>/acc); configure '
                         'train_cfg.val')

    def accs(row: dict) -> dict[str, float]:
        out = {d: _num(row.get(f'val/{d}/acc')) for d in domains}
        out['avg'] = sum(out[d] for d in domains) / len(domains)
        return out

    best_row = max(val, key=lambda r: accs(r)['avg'])  # first of equals: the earliest
    final, best = accs(val[-1]), accs(best_row)
    avgs = [accs(r)['avg'] for r in val]
    steps = [_num(r.get('entropy/policy')) for r in history if r.get('step', 0) > 0]
    steps = [v for v in steps if not math.isnan(v)]
    group = {d: _tail_mean(history, f'entropy/group_nll/{d}') for d in domains}
    gains = [final[d] - accs(val[0])[d] for d in domains]
    return dict(
        domains=domains, start=accs(val[0]), final=final, best=best,
        best_step=int(best_row['step']), final_step=int(val[-1]['step']),
        oscillation=(sum(abs(b - a) for a, b in zip(avgs, avgs[1:])) / (len(avgs) - 1)
                     if len(avgs) > 1 else math.nan),
        late_drop=best['avg'] - final['avg'], gain_min=min(gains), gain_spread=_spread(gains),
        entropy_policy_tail=_tail_mean(history, 'entropy/policy'),
        entropy_policy_max=max(steps) if steps else math.nan,
        group_entropy_tail=group,
        group_entropy_spread=_spread([v for v in group.values() if not math.isnan(v)]))


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``ddof=1``; NaN std for a single value)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean)**2 for v in values) / (len(values) - 1))


def compare(values: Sequence[float], reference: Sequence[float]) -> dict:
    """Difference of means and whether it exceeds seed noise (two standard errors).

    Returns:
        ``{"diff", "se", "beyond_noise"}``; ``beyond_noise`` is None when either side has
        fewer than two seeds (no noise estimate).
    """
    (m, s), (r, t) = mean_std(values), mean_std(reference)
    n, k = len(values), len(reference)
    if n < 2 or k < 2:
        return dict(diff=m - r, se=math.nan, beyond_noise=None)
    se = math.sqrt(s**2 / n + t**2 / k)
    return dict(diff=m - r, se=se, beyond_noise=abs(m - r) > 2 * se)


def _fmt(mean: float, std: float, bold: bool = False, digits: int = 3) -> str:
    if math.isnan(mean):
        return '-'
    text = f'{mean:.{digits}f}' + ('' if math.isnan(std) else f' ± {std:.{digits}f}')
    return f'**{text}**' if bold else text


def _accuracy_table(summaries: dict[str, list[dict]], methods: Sequence[str],
                    domains: Sequence[str], extra: dict[str, Sequence[str]] | None = None) -> str:
    """Rows: methods; columns: per-domain accuracy and the average, best then final."""
    columns = [(which, d) for which in ('best', 'final') for d in (*domains, 'avg')]
    means = {m: {c: mean_std([s[c[0]][c[1]] for s in summaries[m]]) for c in columns}
             for m in methods}
    top = {c: max(means[m][c][0] for m in methods) for c in columns}
    head = ['method', 'seeds'] + [f'{w} {d}' for w, d in columns] + list(extra or {})
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for m in methods:
        cells = [_fmt(*means[m][c], bold=len(methods) > 1 and means[m][c][0] == top[c])
                 for c in columns]
        lines.append('| ' + ' | '.join([label(m), str(len(summaries[m])), *cells,
                                       *[v[i] for v in (extra or {}).values()
                                         for i in [methods.index(m)]]]) + ' |')
    return '\n'.join(lines)


def _verdict(name: str, values: Sequence[float], reference: Sequence[float], ref_name: str,
             what: str) -> str:
    c = compare(values, reference)
    if c['beyond_noise'] is None:
        return (f'- {name}: {what} {c["diff"]:+.3f} vs {ref_name}; no noise estimate '
                '(fewer than 2 seeds)')
    verdict = 'exceeds' if c['beyond_noise'] else 'is within'
    return (f'- {name}: {what} {c["diff"]:+.3f} vs {ref_name} (2 se = {2 * c["se"]:.3f}): '
            f'{verdict} seed noise')


def results_markdown(summaries: dict[str, list[dict]], methods: Sequence[str],
                     reference: str = 'grpo', header: str = '') -> str:
    """``results.md``: Table 1, the noise verdicts, Table 2, curve and entropy statistics.

    Args:
        summaries: method -> one :func:`summarize_run` per seed.
        methods: table order (methods without runs are left out).
        reference: the baseline of the "beyond seed noise" lines (GRPO in the paper).
        header: text put first (setting, command, wall time).
    """
    methods = [m for m in methods if summaries.get(m)]
    if not methods:
        raise ValueError('no finished runs to report')
    domains = summaries[methods[0]][0]['domains']
    start = summaries[methods[0]][0]['start']
    out = [header.rstrip() + '\n' if header else '',
           '## Table 1: validation accuracy (avg@n) per domain, mean ± std over seeds\n',
           'At the best validation step of each run (`best`, picked on the same held-out set) '
           'and at the last one (`final`); the best mean per column in bold. Before RL: '
           + ', '.join(f'{d} {start[d]:.3f}' for d in (*domains, 'avg')) + '.\n',
           _accuracy_table(summaries, [m for m in methods if m not in ABLATIONS], domains),
           '']
    if reference in methods:
        out.append(f'### Difference from {label(reference)} (average over domains)\n')
        ref_best = [s['best']['avg'] for s in summaries[reference]]
        ref_final = [s['final']['avg'] for s in summaries[reference]]
        for m in methods:
            if m == reference:
                continue
            out.append(_verdict(label(m), [s['final']['avg'] for s in summaries[m]], ref_final,
                                label(reference), 'final avg'))
            out.append('  ' + _verdict('', [s['best']['avg'] for s in summaries[m]], ref_best,
                                       label(reference), 'best avg')[4:])
        out.append('')
    ablations = [m for m in ('gepo', *ABLATIONS) if m in methods]
    if len(ablations) > 1:
        out += ['## Table 2: ablations of GEPO (section 3.2)\n',
                _accuracy_table(summaries, ablations, domains), '']
        gepo_final = [s['final']['avg'] for s in summaries['gepo']] if 'gepo' in methods else []
        for m in ablations[1:]:
            if gepo_final:
                out.append(_verdict(label(m), [s['final']['avg'] for s in summaries[m]],
                                    gepo_final, 'GEPO', 'final avg'))
        out.append('')
    out += ['## Curves and entropy (Figures 3-5 in numbers), mean ± std over seeds\n',
            '`oscillation`: mean |change| of the average validation accuracy between '
            'consecutive validations; `late drop`: best - final average; `min gain` and '
            '`gain spread`: the smallest per-domain gain (final - before RL) and the standard '
            'deviation of the gains across domains (low = balanced); policy entropy over '
            'the last quarter of steps and its maximum; group entropy per domain over the last '
            'quarter of steps, and `spread`: its standard deviation across domains (low = '
            'homogenised levels).\n']
    head = ['method', 'oscillation', 'late drop', 'min gain', 'gain spread', 'policy H (end)',
            'policy H (max)',
            *[f'group H {d}' for d in domains], 'spread']
    out += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for m in methods:
        s = summaries[m]
        cells = [_fmt(*mean_std([r[k] for r in s])) for k in
                 ('oscillation', 'late_drop', 'gain_min', 'gain_spread', 'entropy_policy_tail',
                 'entropy_policy_max')]
        cells += [_fmt(*mean_std([r['group_entropy_tail'][d] for r in s])) for d in domains]
        cells.append(_fmt(*mean_std([r['group_entropy_spread'] for r in s])))
        out.append('| ' + ' | '.join([label(m), *cells]) + ' |')
    out.append('')
    return '\n'.join(out)


def _band(histories: Sequence[Sequence[dict]], key: str) -> tuple[list, list, list]:
    """Steps, mean and std over runs of ``key`` at the steps every run logged it."""
    per_run = [{r['step']: _num(r.get(key)) for r in h if r.get(key) is not None}
               for h in histories]
    steps = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
    stats = [mean_std([p[s] for p in per_run]) for s in steps]
    return steps, [m for m, _ in stats], [0.0 if math.isnan(s) else s for _, s in stats]


def _smooth(ys: list[float], window: int) -> list[float]:
    """Trailing moving average (the first points average what exists so far)."""
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= window:
            acc -= ys[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _shaded(ax, xs, mean, std, name: str, smooth: int = 1, **kw) -> None:
    if smooth > 1:
        mean, std = _smooth(mean, smooth), _smooth(std, smooth)
    line, = ax.plot(xs, mean, label=name, lw=1.5, marker='o' if len(xs) < 15 else None, ms=3,
                    **kw)
    ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                    color=line.get_color(), alpha=0.15, lw=0)


def plot_figures(histories: dict[str, list[list[dict]]], methods: Sequence[str],
                 out_dir: str | Path, smooth: int = 5) -> list[Path]:
    """Figures 3, 4 and 5 (mean over seeds, shading ± std) as PNG files in ``out_dir``.

    * ``fig3_validation.png``: validation accuracy per domain and on average, one line per
      method;
    * ``fig4_policy_entropy.png``: token-mean policy entropy over steps per method;
    * ``fig5_group_entropy.png``: one panel per method, per-domain group entropy over steps.

    Training-step series (Figures 4, 5) are smoothed with a trailing ``smooth``-step mean.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    methods = [m for m in methods if histories.get(m)]
    domains = domains_of(histories[methods[0]][0])
    paths = []

    fig, axes = plt.subplots(1, len(domains) + 1, figsize=(4 * (len(domains) + 1), 3.6),
                             squeeze=False)
    for ax, d in zip(axes[0], (*domains, None)):
        key = 'val/acc' if d is None else f'val/{d}/acc'
        for m in methods:
            _shaded(ax, *_band(histories[m], key), label(m),
                    ls='--' if m in ABLATIONS else '-')
        ax.set_title('average' if d is None else d)
        ax.set_xlabel('RL step')
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel('validation accuracy')
    axes[0][-1].legend(fontsize=7)
    fig.suptitle('Figure 3: validation accuracy (mean ± std over seeds)')
    fig.tight_layout()
    paths.append(out_dir / 'fig3_validation.png')
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for m in methods:
        _shaded(ax, *_band(histories[m], 'entropy/policy'), label(m), smooth=smooth,
                ls='--' if m in ABLATIONS else '-')
    ax.set_xlabel('RL step')
    ax.set_ylabel('token-mean policy entropy')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f'Figure 4: policy entropy (mean ± std over seeds, {smooth}-step mean)')
    fig.tight_layout()
    paths.append(out_dir / 'fig4_policy_entropy.png')
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    cols = min(4, len(methods))
    rows = math.ceil(len(methods) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.3 * rows), squeeze=False,
                             sharey=True)
    for ax, m in zip(axes.flat, methods):
        for d in domains:
            _shaded(ax, *_band(histories[m], f'entropy/group_nll/{d}'), d, smooth=smooth)
        ax.set_title(label(m))
        ax.set_xlabel('RL step')
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(methods):]:
        ax.axis('off')
    axes[0][0].set_ylabel('group entropy (sampled-token NLL)')
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f'Figure 5: per-domain group entropy (mean ± std over seeds, {smooth}-step '
                 'mean)')
    fig.tight_layout()
    paths.append(out_dir / 'fig5_group_entropy.png')
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
