"""Streaming generation, ``train_cfg.max_staleness = k >= 2``
(:mod:`~gepo_xtuner.engine.step.stream`).

First the stage alone, driven in the loop's call order with a stand-in engine that
records the weights it held at the start and the end of every call: step ``s`` trains
exactly batch ``s``, every group is whole and of one version at most ``k`` behind, the
buffer stays within ``k`` batches, no push happens during a generation, and a restored
group that is too old is dropped and generated again. Then real ``xtuner train`` runs of
the tiny CPU policy: the metrics, and a resume that trains every prompt exactly once.
"""

import itertools
import json
import math
import threading
import time
from contextlib import contextmanager, nullcontext
from types import SimpleNamespace

import pytest
import torch

from gepo_xtuner.engine.step.batching import Rollouts, build_response_batch
from gepo_xtuner.engine.step.rollout_stage import RolloutStageStream, build_rollout_stage
from gepo_xtuner.engine.train_cfg import StageSettings
from gepo_xtuner.rollout import RolloutRequest, RolloutSample, SamplingParams

from .conftest import scalars, train, write_config

PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=4, stop_token_ids=(2, ))
B = 3  # prompts per batch
NO_HOOKS = SimpleNamespace(hooks=[], iter=0)  # a runner without a CheckpointHook


class StreamBackend:
    """A stand-in engine: per call, the weights (a counter the test's "push" raises) at
    its start and its end, the thread and the prompts; ``delay`` seconds per call,
    ``fail_at``: the call (0-based) that raises."""

    def __init__(self, delay: float = 0.0, fail_at: int | None = None) -> None:
        self.weights = 0
        self.delay = delay
        self.fail_at = fail_at
        self.calls: list[dict] = []
        self.prepared = False

    def request_slots(self) -> None:  # no limit of its own, as the in-process backend
        return None

    def prepare_overlap(self) -> None:
        self.prepared = True

    def generate(self, requests, params):
        before = self.weights
        if self.fail_at == len(self.calls):
            raise OSError('the engine went away')
        time.sleep(self.delay)
        self.calls.append(dict(before=before, after=self.weights, seed=params.seed,
                               thread=threading.current_thread().name,
                               ids=[r.input_ids[0] for r in requests]))
        return [[RolloutSample([1, 2], [-0.5, -0.5], 'stop') for _ in range(params.n)]
                for _ in requests]


def source():
    """Batch s holds the records 100 s + i."""
    return ([dict(id=100 * step + i) for i in range(B)] for step in itertools.count())


def make(k: int, backend: StreamBackend, steps: int) -> RolloutStageStream:
    stage = build_rollout_stage(StageSettings(k), backend, source(),
                                lambda records: [RolloutRequest([r['id']]) for r in records],
                                lambda: 7, max_steps=steps)
    assert type(stage) is RolloutStageStream
    return stage


def drive(stage, backend, steps: int, first: int = 0, train_seconds: float = 0.0,
          params: SamplingParams = PARAMS) -> list[dict]:
    """The loop's calls for steps ``first .. steps - 1`` (the source already advanced to
    ``first``, as the loop does on resume): per step its index, ids, samples, the groups'
    versions and the stage's metrics."""
    @contextmanager
    def clock(name):
        assert name == 'rollout_pause_wait'
        yield

    seen = []
    stage.start()
    for step in range(first, steps):
        records = stage.next_records()
        requests = stage.encode(records)
        samples, version, seconds = stage.responses(step, records, requests, params,
                                                    step + 1 == steps)
        time.sleep(train_seconds)  # the update, while the producer goes on
        stage.before_sync(clock)
        backend.weights += 1  # the push: the producer is parked
        batch = build_response_batch([r.input_ids for r in requests], samples, 0)
        metrics = stage.step_metrics(step, Rollouts(records, samples, batch, version, seconds),
                                     1.0)
        stage.end_step(NO_HOOKS, steps, [{}])
        seen.append(dict(step=step, ids=[r['id'] for r in records], samples=samples,
                         metrics=metrics,
                         versions=[sorted({s.weight_version for s in g}) for g in samples],
                         sizes=[len(g) for g in samples]))
    stage.finish()
    return seen


@pytest.mark.parametrize('k,delay,train_seconds', [(2, 0.0, 0.05), (3, 0.0, 0.05),
                                                   (2, 0.01, 0.0)])
def test_each_step_trains_its_batch_whole_and_at_most_k_versions_old(k, delay,
                                                                     train_seconds):
    """A fast producer (parks at the bound) and a slow one (the step waits)."""
    steps = 7
    backend = StreamBackend(delay)
    stage = make(k, backend, steps)
    seen = drive(stage, backend, steps, train_seconds=train_seconds)
    assert backend.prepared and not stage._threads  # finish() joined the producer
    # step s trains batch s, the synchronous loop's records, each prompt once
    assert [row['ids'] for row in seen] == [[100 * s + i for i in range(B)]
                                            for s in range(steps)]
    for s, row in enumerate(seen):
        assert row['sizes'] == [PARAMS.n] * B  # whole groups ...
        assert all(len(v) == 1 for v in row['versions'])  # ... of one version each
        versions = [v[0] for v in row['versions']]
        assert all(s - k <= v <= s for v in versions), (s, versions)
        m = row['metrics']
        assert m['rollout/staleness_max'] == s - min(versions) <= k
        assert m['rollout/staleness'] == pytest.approx(s - sum(versions) / B)
        assert 0 <= m['rollout/buffer_groups'] <= k * B  # at most k batches ahead
        assert m['rollout/dropped_stale'] == 0
        assert m['perf/gen_tokens'] == 2 * PARAMS.n * B and m['time/rollout_generate'] >= 0
    # every group generated once, on the producer thread, with weights that no push
    # changed during the call, at most k versions before its batch, never past the end
    generated = [i for c in backend.calls for i in c['ids']]
    assert sorted(generated) == [100 * s + i for s in range(steps) for i in range(B)]
    assert all(c['before'] == c['after'] and c['thread'].startswith('rollout-stream')
               for c in backend.calls)
    assert all(c['ids'][0] // 100 - c['before'] <= k for c in backend.calls)
    assert len({c['seed'] for c in backend.calls}) == len(backend.calls)  # a seed per group
    if delay == 0:  # a fast producer runs ahead: later batches are older than 0
        assert max(row['metrics']['rollout/staleness_max'] for row in seen) >= 1


def saved_group(batch: int, position: int, prompt_id: int, version: int) -> dict:
    return dict(batch=batch, position=position, prompt_id=prompt_id, version=version,
                seconds=0.5, samples=[(torch.tensor([5, 2], dtype=torch.int32),
                                       torch.tensor([-0.25, -1.0]), 'stop')] * PARAMS.n)


def test_restored_groups_too_old_or_misplaced_are_generated_again():
    """Resumed at step 2 with k=2 from a checkpoint written with k=3: batch 2's saved
    group (version 0, 2 old) is trained as saved; batch 3's (version 0, 3 old at step 3)
    is dropped at step 3 and generated again; one saved under another record is not
    placed; one of batch 5, beyond what k=2 draws at step 2, is not placed either."""
    from gepo_xtuner.engine.step.overlap import sampling_signature
    steps, first = 6, 2
    backend = StreamBackend()
    backend.weights = first  # the loop pushed the checkpoint's weights
    stage = make(2, backend, steps)
    for _ in range(first):  # the loop skips the batches trained before the checkpoint
        next(stage.source)
    state = dict(step=first, max_staleness=3, sampling=sampling_signature(PARAMS),
                 groups=[saved_group(2, 0, 200, 0), saved_group(3, 1, 301, 0),
                         saved_group(3, 2, 999, 1), saved_group(5, 0, 500, 1)])
    stage.restore(dict(ranks=[dict(rollout_stream=state)]), dict(rollout_stream=state))
    seen = drive(stage, backend, steps, first=first)
    assert [row['ids'] for row in seen] == [[100 * s + i for i in range(B)]
                                            for s in range(first, steps)]
    assert seen[0]['versions'][0] == [0] and seen[0]['metrics']['rollout/staleness_max'] == 2
    assert [row['metrics']['rollout/dropped_stale'] for row in seen] == [0, 1, 0, 0]
    assert all(row['metrics']['rollout/staleness_max'] <= 2 for row in seen)
    # generated: everything but the one group trained as saved; 301 twice would mean
    # the first try at it was not the saved one
    generated = sorted(i for c in backend.calls for i in c['ids'])
    assert generated == sorted(100 * s + i for s in range(first, steps) for i in range(B)
                               if (s, i) != (2, 0))
    # the dropped one was generated with the weights of step 3 or later (it waited at
    # the head of the producer's order)
    [again] = [c for c in backend.calls if c['ids'] == [301]]
    assert again['before'] >= 3 and seen[1]['versions'][1] == [again['before']]


def test_a_checkpoint_holds_the_complete_untrained_groups():
    """state_dict after a step: the groups of later batches, with version and prompt; a
    fresh stage restored from it trains them without generating them."""
    steps = 5
    backend = StreamBackend()
    stage = make(2, backend, steps)
    drive(stage, backend, 2, train_seconds=0.02)  # stops after step 2 (max_steps 5)
    state = stage.state_dict()
    assert state['step'] == 2 and state['max_staleness'] == 2
    assert {g['batch'] for g in state['groups']} <= {2, 3}
    assert all(g['prompt_id'] == 100 * g['batch'] + g['position'] and g['version'] <= 1
               for g in state['groups'])
    resumed = StreamBackend()
    resumed.weights = 2
    fresh = make(2, resumed, steps)
    next(fresh.source), next(fresh.source)
    fresh.restore(dict(ranks=[dict(rollout_stream=state)]), dict(rollout_stream=state))
    drive(fresh, resumed, steps, first=2)
    saved_ids = {g['prompt_id'] for g in state['groups']}
    regenerated = {i for c in resumed.calls for i in c['ids']}
    assert not saved_ids & regenerated
    assert saved_ids | regenerated == {100 * s + i for s in range(2, steps) for i in range(B)}


def test_a_failed_generation_is_raised_on_the_main_thread_and_discard_joins():
    backend = StreamBackend(fail_at=4)
    stage = make(2, backend, 6)
    with pytest.raises(RuntimeError, match="rollout stream's generation failed: the engine "
                                           'went away'):
        drive(stage, backend, 6, train_seconds=0.02)
    stage.discard()
    assert not stage._threads


def test_with_the_in_process_backend_a_groups_responses_do_not_depend_on_timing():
    """The versions depend on thread timing; the content, given the weights, does not:
    with weights that no step changes, two runs whose trainer takes different times
    sample the same responses, group for group (each group is sampled
    alone, from the private generator seeded with its own seed)."""
    from gepo_xtuner.rollout import HFRolloutBackend
    from gepo_xtuner.testbed.tiny import build_char_tokenizer, build_tiny_model
    tok = build_char_tokenizer()
    model = build_tiny_model(len(tok), seed=1)
    runs = []
    for train_seconds in (0.0, 0.03):
        backend = HFRolloutBackend()
        backend.attach(model, tok)
        stage = build_rollout_stage(
            StageSettings(2), backend, source(),
            lambda records: [RolloutRequest([1, 4 + r['id'] % 40, 5]) for r in records],
            lambda: 7, max_steps=4)
        params = SamplingParams(n=2, temperature=1.0, max_new_tokens=5,
                                stop_token_ids=(tok.eos_token_id, ))
        stage.start()
        got = []
        for step in range(4):
            records = stage.next_records()
            samples, _, _ = stage.responses(step, records, stage.encode(records), params,
                                            step == 3)
            got.append([[(s.response_ids, s.logprobs) for s in g] for g in samples])
            time.sleep(train_seconds)
            stage.before_sync(lambda name: nullcontext())
            stage.end_step(NO_HOOKS, 4, [{}])
        stage.finish()
        runs.append(got)
    assert runs[0] == runs[1]
    assert len({str(g) for step in runs[0] for g in step}) > 1  # not one answer for all


@pytest.mark.parametrize('bad', [-1, 1.5, True, '2'])
def test_max_staleness_takes_any_int_from_zero(bad):
    assert StageSettings(5).max_staleness == 5
    with pytest.raises(ValueError, match=r'train_cfg.max_staleness must be an int >= 0'):
        StageSettings(bad)


# -- real runs --------------------------------------------------------------------------------
STEPS = 4
STREAM = ['train_cfg.max_staleness=2', f'train_cfg.max_steps={STEPS}', 'train_cfg.val=None',
          'train_cfg.rollout.type=RecordingRolloutBackend',
          'train_cfg.rewards.default.type=DigitShareReward',
          'default_hooks.checkpoint.interval=1', 'default_hooks.checkpoint.max_keep_ckpts=-1']
HOOKS = "custom_hooks = [dict(type='TrainedPromptsHook')]"  # the records of every step


def trained(work) -> dict[int, list[str]]:
    return {row['step']: row['ids'] for row in map(json.loads,
                                                   open(work / 'trained_rank0.jsonl'))}


@pytest.fixture(scope='module')
def streamed(tiny_dir, tmp_path_factory):
    """A straight 4-step run with max_staleness=2, a checkpoint after every step."""
    tmp = tmp_path_factory.mktemp('stream')
    log = tmp / 'generate.log'
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv('GEPO_TEST_GENERATE_LOG', str(log))
        train(write_config(tmp, extra=HOOKS), tmp / 'run', tiny_dir, *STREAM)
    return tmp / 'run', log


def test_a_streamed_run_trains_within_the_bound_and_logs_it(streamed):
    work, log = streamed
    logged = scalars(work)
    assert sorted(logged) == list(range(1, STEPS + 1))
    for t in range(1, STEPS + 1):
        m = logged[t]
        assert 0 <= m['rollout/staleness'] <= m['rollout/staleness_max'] <= min(2, t - 1)
        assert 0 <= m['rollout/buffer_groups'] <= 2 * 4  # k batches of B = 4
        assert m['rollout/dropped_stale'] == 0
        assert m['time/rollout_generate'] > 0 and 'time/rollout_pause_wait' in m
        assert math.isfinite(m['loss/pg'])
    rows = [json.loads(line) for line in open(f'{log}.0')]
    # one group per call, on the producer thread, no push during any of them, each
    # prompt of the 4 batches once
    assert all(r['prompts'] == 1 and r['thread'].startswith('rollout-stream') and r['seeded']
               and r['before'] == r['after'] for r in rows)
    assert len(rows) == STEPS * 4
    ids = trained(work)
    assert len({i for step in ids.values() for i in step}) == STEPS * 4


def test_a_resumed_streamed_run_trains_every_prompt_once(streamed, tiny_dir, tmp_path,
                                                         monkeypatch):
    """Resumed from the checkpoint of step 2: the prompts of steps 3 and 4 are those the
    straight run trained then, none of steps 1-2 again; the groups the checkpoint holds
    are trained as saved (not generated again), the rest generated anew."""
    work, _ = streamed
    straight = trained(work)
    ckpt = work / 'iter_2.pth'
    saved = torch.load(ckpt, map_location='cpu', weights_only=False)[
        'gepo_xtuner/rl_loop']['ranks'][0]['rollout_stream']
    assert saved['step'] == 2 and {g['batch'] for g in saved['groups']} <= {2, 3}
    assert all(2 - g['version'] <= 2 and g['version'] <= 1 for g in saved['groups'])
    log = tmp_path / 'generate.log'
    monkeypatch.setenv('GEPO_TEST_GENERATE_LOG', str(log))
    resumed = tmp_path / 'resumed'
    train(write_config(tmp_path, extra=HOOKS), resumed, tiny_dir, *STREAM, '--resume',
          str(ckpt))
    after = trained(resumed)
    assert sorted(after) == [3, 4]
    assert [after[3], after[4]] == [straight[3], straight[4]]
    before = [i for t in (1, 2) for i in straight[t]]
    everything = before + after[3] + after[4]
    assert len(everything) == len(set(everything)) == STEPS * 4  # each prompt exactly once
    rows = open(f'{log}.0').readlines() if (tmp_path / 'generate.log.0').exists() else []
    assert len(rows) == 2 * 4 - len(saved['groups'])  # the saved groups are not generated
    logged = scalars(resumed)
    assert all(logged[t]['rollout/staleness_max'] <= 2 for t in (3, 4))
