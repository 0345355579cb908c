"""Where run-health alarms started, and their marks on the training-curve panels."""

from collections.abc import Iterable


def alarm_starts(history: list[dict]) -> list[tuple[float, str, str]]:
    """``(step, alarm, domain)`` of each alarm at the step it started to hold.

    Reads the ``health/<alarm>/<domain>`` metrics of
    :class:`~gepo_xtuner.engine.runtime.health_hook.RunHealthHook` (1 while the alarm holds;
    absent or 0 otherwise).
    """
    starts: list[tuple[float, str, str]] = []
    holding: set[str] = set()
    for row in history:
        now = {k for k, v in row.items()
               if k.startswith('health/') and k.count('/') == 2 and v and v == v}
        for key in sorted(now - holding):
            _, alarm, domain = key.split('/')
            starts.append((row['step'], alarm, domain))
        holding = now
    return starts


def mark_alarms(axes: Iterable, history: list[dict]) -> int:
    """A dotted red line at each alarm's start on every panel, named on the first one.

    Returns:
        The number of alarm starts marked.
    """
    axes = list(axes)
    starts = alarm_starts(history)
    for step, alarm, domain in starts:
        for ax in axes:
            ax.axvline(step, color='tab:red', ls=':', lw=1.2, alpha=0.8)
        axes[0].annotate(f'{alarm} [{domain}]', xy=(step, 1), xycoords=('data', 'axes fraction'),
                         xytext=(2, -4), textcoords='offset points', rotation=90, va='top',
                         fontsize=7, color='tab:red')
    return len(starts)
