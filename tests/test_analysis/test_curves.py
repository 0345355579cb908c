"""The run's figure: the series it draws come from the step history."""

import math

from gepo_xtuner.analysis.curves import _series, band_series, plot_training_curves


def history():
    rows = []
    for step in range(1, 6):
        row = {'step': float(step), 'entropy/group_nll/add': 0.5 + 0.01 * step,
               'entropy/group_nll/copy': 0.2, 'reward/mean/add': 0.3, 'reward/mean/copy': 0.9,
               'shaping/frac_damped_pos/copy': 0.4, 'shaping/frac_damped_neg/add': 0.1}
        if step > 1:  # the band exists from the second step
            row.update({'band/low': 0.3, 'band/high': 0.45})
        if step in (1, 5):
            row.update({'val/add/acc': 0.2 * step / 5, 'val/copy/acc': 0.9})
        rows.append(row)
    rows[0]['band/low'] = math.nan
    return rows


def test_series_and_band_skip_missing_and_undefined_values():
    h = history()
    assert _series(h, 'val/', '/acc') == {'add': ([1.0, 5.0], [0.04, 0.2]),
                                          'copy': ([1.0, 5.0], [0.9, 0.9])}
    assert set(_series(h, 'entropy/group_nll/')) == {'add', 'copy'}
    steps, low, high = band_series(h)
    assert steps == [2.0, 3.0, 4.0, 5.0] and low == [0.3] * 4 and high == [0.45] * 4


def test_the_band_is_read_under_its_own_name_not_a_shapers():
    """Only ``band/low|high`` is drawn: a shaper's own metrics (GEPO's) are not the band."""
    gepo_only = [{'step': 1.0, 'gepo/h_low': 0.3, 'gepo/h_high': 0.45}]
    assert band_series(gepo_only) == ([], [], [])


def test_figure_is_written(tmp_path):
    out = plot_training_curves(history(), tmp_path / 'curves.png', title='t')
    assert out.read_bytes()[:4] == b'\x89PNG'
    plot_training_curves([{'step': 1.0, 'reward/mean/a': 0.5}], tmp_path / 'grpo.png')
    assert (tmp_path / 'grpo.png').stat().st_size > 0
