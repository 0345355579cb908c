"""The accumulation replay: mmengine's counters misplace steps; the loop's explicit step does not."""

import importlib.util

from .test_check_config import ROOT

spec = importlib.util.spec_from_file_location('replay', ROOT / 'tools' / 'replay_accumulation.py')
replay = importlib.util.module_from_spec(spec)
spec.loader.exec_module(replay)


def test_explicit_steps_are_exact_where_the_wrapper_counters_are_not():
    micro, minibatches, steps = 4, 2, 5  # max_steps 5 is not a multiple of 4 micro-batches
    explicit = replay.replay_explicit(micro, minibatches, steps)
    assert len(explicit['grads']) == steps * minibatches
    assert all(abs(g - 1.0) < 1e-6 for g in explicit['grads'])
    wrapper = replay.replay_wrapper(micro, minibatches, steps, resume_at=None)
    assert any(abs(g - 1.0) > 1e-3 for g in wrapper['grads'])  # divided by the remainder
    resumed = replay.replay_wrapper(micro, minibatches, steps, resume_at=3)
    assert resumed['ends'].count(False) > 0  # steps in the middle of a minibatch
