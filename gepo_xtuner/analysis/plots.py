"""Figures of a rollout analysis: the paper's Figure 2a/2b for the user's own data."""

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure  # no pyplot: no backend is selected, files only


def _violin(ax, data: dict[str, np.ndarray], ylabel: str) -> None:
    names = [k for k, v in data.items() if len(v)]
    values = [data[k] for k in names]
    if not names:
        ax.text(0.5, 0.5, 'no data', ha='center', va='center', transform=ax.transAxes)
        return
    parts = ax.violinplot(values, showmeans=True, showextrema=False)
    for body in parts['bodies']:
        body.set_alpha(0.5)
    for i, v in enumerate(values, start=1):
        jitter = np.random.default_rng(i).uniform(-0.08, 0.08, len(v))
        ax.scatter(i + jitter, v, s=4, alpha=0.35, color='k', linewidths=0)
        ax.annotate(f'{np.mean(v):.2f}', (i, np.max(v)), textcoords='offset points',
                    xytext=(0, 4), ha='center', fontsize=8)
    ax.set_xticks(range(1, len(names) + 1), names, rotation=20)
    ax.set_ylabel(ylabel)
    ax.grid(axis='y', alpha=0.3)


def plot_group_entropy(per_domain: dict[str, np.ndarray], path: Path, title: str) -> Path:
    """Figure 2a: distribution of per-prompt group entropy by domain (means annotated)."""
    fig = Figure(figsize=(1.6 * max(3, len(per_domain)) + 1, 4))
    ax = fig.subplots()
    _violin(ax, per_domain, 'group entropy $\\mathcal{H}_g$ (nats / token)')
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def plot_advantages(before: dict[str, np.ndarray], after: dict[str, np.ndarray], path: Path,
                    title: str) -> Path:
    """Figure 2b: advantage histograms per domain, before (GRPO) and after shaping."""
    names = list(before)
    fig = Figure(figsize=(3.2 * len(names), 3.2))
    axes = fig.subplots(1, len(names), squeeze=False)
    for ax, name in zip(axes[0], names):
        b, a = before[name], after[name]
        lo, hi = (min(b.min(), a.min()), max(b.max(), a.max())) if len(b) else (-1, 1)
        bins = np.linspace(lo, hi if hi > lo else lo + 1, 31)
        ax.hist(b, bins=bins, alpha=0.55, label='before shaping')
        if not np.array_equal(a, b):
            ax.hist(a, bins=bins, alpha=0.55, label='after shaping')
        ax.set_title(name)
        ax.set_xlabel('advantage')
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel('responses')
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def plot_thresholds(thresholds: list[dict], path: Path) -> Path:
    """Batch mean group entropy with its +-sigma band and the thresholds used, over steps."""
    steps = [t['step'] for t in thresholds]
    nan = float('nan')
    col = lambda k: np.array([nan if t[k] is None else t[k] for t in thresholds])  # noqa: E731
    mu, sigma = col('mu'), col('sigma')
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    ax.plot(steps, mu, label='batch mean $\\mu$', color='k')
    ax.fill_between(steps, mu - sigma, mu + sigma, alpha=0.15, color='k', label='$\\pm\\sigma$')
    if any(t['h_low'] is not None for t in thresholds):
        ax.plot(steps, col('h_low'), label='$H_{low}$ used', color='tab:blue')
        ax.plot(steps, col('h_high'), label='$H_{high}$ used', color='tab:red')
    ax.set_xlabel('step')
    ax.set_ylabel('group entropy')
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
