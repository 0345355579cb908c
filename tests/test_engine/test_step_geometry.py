"""The loop's batch-arithmetic warnings (:func:`warn_step_geometry`), as a user reads them
in the run's log."""

import pytest
from mmengine.logging import MMLogger

from gepo_xtuner.engine.step.geometry import StepGeometry, warn_step_geometry


def logged(capsys, *args) -> str:
    MMLogger.get_instance('gepo-geometry-test')  # the "current" logger print_log writes to
    warn_step_geometry(*args)
    out = capsys.readouterr()
    return out.out + out.err


def test_a_minibatch_larger_than_the_step_is_logged_with_the_geometrys_words(capsys):
    args = (4, 2, 16, 1, 1, None, None)  # 8 responses per rank, minibatches of 16
    expected = StepGeometry(*args).warnings()
    assert expected and expected[0] in logged(capsys, *args)


def test_nothing_is_logged_for_a_sound_step_or_a_varying_batch_size(capsys):
    assert 'WARNING' not in logged(capsys, 8, 4, 16, 1, 1, None, None)
    assert logged(capsys, None, 4, 1000, 1, 1, None, None) == ''  # custom batch sampler


def test_global_sizes_a_world_cannot_split_are_refused():
    with pytest.raises(ValueError, match='cannot split the batch evenly'):
        warn_step_geometry(4, 2, 8, 1, 3, 8, None)
