"""Training-curve figure from per-step metric history."""

from pathlib import Path

from matplotlib.figure import Figure  # no pyplot: no backend is selected, files only

from ..advantage.base import BAND_KEYS
from .health_marks import mark_alarms

Series = dict[str, tuple[list[float], list[float]]]


def _series(history: list[dict], prefix: str, suffix: str = '') -> Series:
    """``name -> (steps, values)`` of the metrics ``<prefix><name><suffix>`` (one level)."""
    out: Series = {}
    for row in history:
        for key, value in row.items():
            if key.startswith(prefix) and key.endswith(suffix) and value is not None:
                name = key[len(prefix):len(key) - len(suffix)]
                if name and '/' not in name and value == value:  # skip NaN
                    xs, ys = out.setdefault(name, ([], []))
                    xs.append(row['step'])
                    ys.append(value)
    return out


def band_series(history: list[dict]) -> tuple[list[float], list[float], list[float]]:
    """Steps and ``[band/low, band/high]`` of the steps that have a band (any shaper's)."""
    low, high = BAND_KEYS
    rows = [r for r in history if r.get(low) is not None
            and r.get(high) is not None and r[low] == r[low]]
    return [r['step'] for r in rows], [r[low] for r in rows], [r[high] for r in rows]


def plot_training_curves(history: list[dict], path: Path, title: str = '') -> Path:
    """Four panels over steps, one colour per domain in all of them.

    1. group entropy ``H_g`` per domain (``entropy/group_nll/<domain>``, the paper's
       Figures 4-5) with the shaper's band ``[low, high]`` (``band/low|high``, whatever
       shaper returned one; GEPO's ``[H_low, H_high]``) shaded: for GEPO, groups below it
       have positive advantages damped, groups above it negative ones;
    2. training reward per domain (``reward/mean/<domain>``);
    3. share of responses whose advantage was damped, per domain: positive
       (``shaping/frac_damped_pos/<domain>``, solid) and negative (``..._neg``, dashed);
       removed responses (``shaping/frac_removed/<domain>``, dotted) for gating shapers;
       a share that is 0 at every step is not drawn;
    4. validation accuracy per domain or benchmark (``val/<name>/acc``, Figure 3).

    Run-health alarms (``health/<alarm>/<domain>``) are marked where they started: a
    dotted red line on every panel, named on the first.

    Args:
        history: one dict per step with ``step`` and the metrics above (absent or
            None where not measured).
        path: the PNG to write.
        title: the figure's title.
    """
    entropy = _series(history, 'entropy/group_nll/')
    reward = _series(history, 'reward/mean/')
    shaping = {style: {name: xy for name, xy in _series(history, f'shaping/frac_{kind}/').items()
                       if any(xy[1])}  # a share that stays 0 (e.g. GEPO removes none) is not drawn
               for kind, style in (('damped_pos', '-'), ('damped_neg', '--'), ('removed', ':'))}
    val = _series(history, 'val/', '/acc')
    names = sorted(set(entropy) | set(reward) | set(val)
                   | {n for s in shaping.values() for n in s})
    colors = {n: f'C{i % 10}' for i, n in enumerate(names)}
    marker = dict(marker='o', ms=3) if len(history) < 30 else {}

    fig = Figure(figsize=(12, 8.5))
    (ax_h, ax_r), (ax_s, ax_v) = fig.subplots(2, 2, sharex=True)
    steps, low, high = band_series(history)
    if steps:
        ax_h.fill_between(steps, low, high, color='0.85', label='shaper band [low, high]')
        ax_h.plot(steps, low, color='0.5', lw=0.8)
        ax_h.plot(steps, high, color='0.5', lw=0.8)
    for ax, series in ((ax_h, entropy), (ax_r, reward), (ax_v, val)):
        for name, (xs, ys) in sorted(series.items()):
            ax.plot(xs, ys, color=colors[name], **marker)
    for style, series in shaping.items():
        for name, (xs, ys) in sorted(series.items()):
            ax_s.plot(xs, ys, color=colors[name], ls=style)
    ax_h.set_ylabel('group entropy $\\mathcal{H}_g$: sampled-token NLL (nats/token)')
    ax_r.set_ylabel('training reward (mean)')
    ax_s.set_ylabel('share of responses shaped')
    ax_v.set_ylabel('validation accuracy')
    for ax in (ax_s, ax_v):
        ax.set_xlabel('step')
    for ax in (ax_h, ax_r, ax_s, ax_v):
        ax.grid(alpha=0.3)
    if steps:
        ax_h.legend(loc='upper right', fontsize=8, framealpha=0.6)
    if any(shaping.values()):
        kinds = [(k, s) for k, s in (('positive damped (low-entropy group)', '-'),
                                     ('negative damped (high-entropy group)', '--'),
                                     ('removed', ':')) if shaping[s]]
        ax_s.legend([ax_s.plot([], [], color='0.3', ls=s)[0] for _, s in kinds],
                    [k for k, _ in kinds], loc='upper right', fontsize=8, framealpha=0.6)
    # one legend for the domains, below the panels, so that it hides no curve
    handles = [ax_r.plot([], [], color=colors[n])[0] for n in names]
    if names:
        fig.legend(handles, names, loc='lower center', ncol=min(len(names), 8), fontsize=9,
                   frameon=False)
    mark_alarms((ax_h, ax_r, ax_s, ax_v), history)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.05 if names else 0, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
