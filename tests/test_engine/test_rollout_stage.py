"""Both rollout stages answer the loop's calls in the loop's order; only what they return
differs: versions, which records, what the run state holds."""

import itertools
from contextlib import contextmanager

import pytest

from gepo_xtuner.engine.step.rollout_stage import (RolloutStage, RolloutStageAhead,
                                                   build_rollout_stage)
from gepo_xtuner.engine.train_cfg import StageSettings
from gepo_xtuner.rollout import RolloutRequest, RolloutSample, SamplingParams

PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=4, stop_token_ids=(2, ), seed=0)


class CountingBackend:
    """A stand-in engine that records the prompts it generates for and when weights change
    (no server or model: the stage's own bookkeeping is what is tested)."""

    def __init__(self) -> None:
        self.weights = 0
        self.calls: list[tuple[int, list[int]]] = []
        self.prepared = False

    def prepare_overlap(self) -> None:
        self.prepared = True

    def generate(self, requests, params):
        self.calls.append((self.weights, [r.input_ids[0] for r in requests]))
        return [[RolloutSample([1, 2], [-0.5, -0.5], 'stop') for _ in range(params.n)]
                for _ in requests]


def drive(stage, backend, steps: int) -> list[tuple[list[int], int, list[int]]]:
    """The loop's call order for ``steps`` steps: (prompt ids, version, stamped versions)."""
    seen = []
    clock_names = []

    @contextmanager
    def clock(name):
        clock_names.append(name)
        yield

    stage.start()
    for step in range(steps):
        records = stage.next_records()
        requests = stage.encode(records)
        samples, version, _ = stage.responses(step, records, requests, PARAMS,
                                              step + 1 == steps)
        seen.append(([r['id'] for r in records], version,
                      sorted({s.weight_version for g in samples for s in g})))
        stage.before_sync(clock)
        backend.weights += 1  # the push
    assert clock_names == ([] if stage.max_staleness == 0 else ['rollout_ahead_wait'] * steps)
    return seen


def make(max_staleness: int):
    backend = CountingBackend()
    source = ([dict(id=10 * step)] for step in itertools.count())
    encode = (lambda records: [RolloutRequest([r['id']]) for r in records])
    return build_rollout_stage(StageSettings(max_staleness), backend, source, encode, lambda: 0), backend


def test_in_turn_each_step_samples_its_records_with_the_last_pushed_weights():
    stage, backend = make(0)
    assert type(stage) is RolloutStage
    seen = drive(stage, backend, 3)
    assert seen == [([0], 0, [0]), ([10], 1, [1]), ([20], 2, [2])]
    assert backend.calls == [(0, [0]), (1, [10]), (2, [20])] and not backend.prepared


def test_ahead_each_step_trains_on_the_batch_sampled_one_version_earlier():
    stage, backend = make(1)
    assert type(stage) is RolloutStageAhead
    seen = drive(stage, backend, 3)
    # step 1 generates its own batch; each later one was sampled during the step before
    assert seen == [([0], 0, [0]), ([10], 0, [0]), ([20], 1, [1])]
    # the same records in the same order as in turn, each generated once, and never
    # after the last step
    assert backend.calls == [(0, [0]), (0, [10]), (1, [20])] and backend.prepared


@pytest.mark.parametrize('max_staleness', [0, 1])
def test_the_generation_metrics_are_the_same_names_plus_staleness_ahead(max_staleness):
    from gepo_xtuner.engine.step.batching import Rollouts, build_response_batch
    stage, _ = make(max_staleness)
    samples = [[RolloutSample([1, 2, 3], [-0.5] * 3, 'stop', 0)] * 2]
    batch = build_response_batch([[7]], samples, pad_token_id=0)
    rollouts = Rollouts([dict(id=0)], samples, batch, version=0,
                        seconds=None if max_staleness == 0 else 2.0)
    metrics = stage.step_metrics(1, rollouts, seconds=1.0)
    assert metrics['perf/gen_tokens'] == 6.0
    if max_staleness == 0:
        assert metrics == {'perf/gen_tokens': 6.0, 'perf/gen_tokens_per_sec': 6.0}
    else:  # generated beside the step: its own wall time
        assert metrics['perf/gen_tokens_per_sec'] == 3.0
        assert metrics['rollout/staleness'] == metrics['rollout/staleness_max'] == 1.0
        assert metrics['time/rollout_generate'] == 2.0
