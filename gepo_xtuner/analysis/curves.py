"""Training-curve figure from per-step metric history."""

from pathlib import Path

from matplotlib.figure import Figure  # no pyplot: no backend is selected, files only


def _series(history: list[dict], prefix: str, suffix: str = '') -> dict[str, tuple[list, list]]:
    out: dict[str, tuple[list, list]] = {}
    for row in history:
        for key, value in row.items():
            if key.startswith(prefix) and key.endswith(suffix) and value is not None:
                name = key[len(prefix):len(key) - len(suffix)]
                if name and '/' not in name and value == value:  # skip NaN
                    xs, ys = out.setdefault(name, ([], []))
                    xs.append(row['step'])
                    ys.append(value)
    return out


def plot_training_curves(history: list[dict], path: Path, title: str = '') -> Path:
    """Per-domain group entropy, validation accuracy and policy entropy over steps.

    Args:
        history: one dict per step with ``step`` and metrics named
            ``entropy/group/<domain>``, ``val/<domain>/acc`` (or ``val/<benchmark>/acc``),
            ``entropy/policy/<domain>``.
        path: the PNG to write.
    """
    panels = [('entropy/group/', '', 'group entropy $\\mathcal{H}_g$'),
              ('val/', '/acc', 'validation accuracy (mean reward)'),
              ('entropy/policy/', '', 'policy token entropy')]
    fig = Figure(figsize=(15, 4))
    axes = fig.subplots(1, 3)
    for ax, (prefix, suffix, label) in zip(axes, panels):
        series = _series(history, prefix, suffix)
        for name, (xs, ys) in sorted(series.items()):
            ax.plot(xs, ys, marker='o' if len(xs) < 30 else None, ms=3, label=name)
        ax.set_xlabel('step')
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
