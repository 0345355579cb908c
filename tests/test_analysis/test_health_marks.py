"""Alarm marks on the training-curve figure: where each alarm started, on every panel."""

from matplotlib.figure import Figure

from gepo_xtuner.analysis.curves import plot_training_curves
from gepo_xtuner.analysis.health_marks import alarm_starts, mark_alarms

HISTORY = [
    {'step': 1.0, 'health/gepo_silent': 0.0, 'reward/mean/add': 0.1},
    {'step': 2.0, 'health/length_collapse/add': 1.0, 'reward/mean/add': 0.5},
    {'step': 3.0, 'health/length_collapse/add': 1.0, 'reward/mean/add': 0.6},  # held: no new mark
    {'step': 4.0, 'health/length_collapse/add': 0.0, 'reward/mean/add': 0.6},
    {'step': 5.0, 'health/length_collapse/add': 1.0, 'health/gepo_silent/all': 1.0},
]


def test_alarm_starts_are_the_steps_an_alarm_begins_to_hold():
    assert alarm_starts(HISTORY) == [(2.0, 'length_collapse', 'add'),
                                     (5.0, 'gepo_silent', 'all'),
                                     (5.0, 'length_collapse', 'add')]


def test_marks_on_every_panel_and_named_on_the_first(tmp_path):
    axes = Figure().subplots(1, 2)
    assert mark_alarms(axes, HISTORY) == 3
    for ax in axes:
        assert sorted(line.get_xdata()[0] for line in ax.lines) == [2.0, 5.0, 5.0]
    assert [t.get_text() for t in axes[0].texts] == [
        'length_collapse [add]', 'gepo_silent [all]', 'length_collapse [add]']
    assert not axes[1].texts
    assert plot_training_curves(HISTORY, tmp_path / 'f.png').is_file()
