"""A batch generated ahead and restored from a checkpoint is trained on only by the step,
prompts and sampling it was made for; otherwise it is dropped and the step generates."""

from dataclasses import replace

import pytest

from gepo_xtuner.engine.step.overlap import PendingRollouts, RolloutAhead, sampling_signature
from gepo_xtuner.rollout import RolloutSample, SamplingParams

PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, stop_token_ids=(2, ))


def saved(params: SamplingParams = PARAMS) -> dict:
    samples = [[RolloutSample([5, 6, 2], [-0.5, -0.25, -1.0], 'stop', 3),
                RolloutSample([7] * 8, [-0.125] * 8, 'length', 3)]]
    return PendingRollouts(4, 3, ['p0'], samples, 1.5, sampling_signature(params)).state_dict()


def take(state: dict, step: int = 4, ids=('p0', ), params: SamplingParams = PARAMS):
    ahead = RolloutAhead(backend=None)  # take() never calls the backend
    ahead.load_state_dict(state)
    return ahead.take(step, list(ids), params)


def test_the_batch_made_for_the_step_round_trips_exactly():
    pending, dropped = take(saved())
    assert dropped is None and pending.version == 3 and pending.seconds == 1.5
    assert [(s.response_ids, s.logprobs, s.finish_reason, s.weight_version)
            for s in pending.samples[0]] == [([5, 6, 2], [-0.5, -0.25, -1.0], 'stop', 3),
                                             ([7] * 8, [-0.125] * 8, 'length', 3)]


def test_another_step_prompts_or_sampling_drop_it_with_the_reason():
    assert take(saved(), step=5) == (None, 'it was generated for step 5, not 6')
    pending, why = take(saved(), ids=('p9', ))
    assert pending is None and "answers prompts ['p0']..., but this rank draws ['p9']" in why
    pending, why = take(saved(), params=replace(PARAMS, temperature=0.7, n=4))
    assert pending is None and why == 'sampling.n was 2, is 4, sampling.temperature was 1.0, is 0.7'
    # the seed is the step's own, not part of what must match
    assert take(saved(), params=replace(PARAMS, seed=123))[0] is not None


def test_a_checkpoint_without_the_sampling_record_is_taken_as_before():
    state = saved()
    del state['sampling']
    assert take(state, params=replace(PARAMS, temperature=0.7))[0] is not None


class SlowBackend:
    """A stand-in with the one method the worker calls (``generate``): it takes a while
    and records that it finished."""

    def __init__(self) -> None:
        self.finished = False

    def generate(self, requests, params):
        import time
        time.sleep(0.3)
        self.finished = True
        raise RuntimeError('the engine failed')


def test_discard_leaves_no_generation_running_and_forgets_its_error():
    backend = SlowBackend()
    ahead = RolloutAhead(backend)
    ahead.launch(1, 0, ['p0'], [], PARAMS)
    assert ahead.running
    ahead.discard()
    assert backend.finished and not ahead.running and ahead.pending is None
    ahead.wait()  # nothing to join, no error re-raised
    assert ahead.take(1, ['p0'], PARAMS) == (None, None)


class EchoBackend:
    """A stand-in with the one method the worker calls: one short response per sample."""

    def generate(self, requests, params):
        return [[RolloutSample([1, 2], [-0.5, -0.5], 'stop') for _ in range(params.n)]
                for _ in requests]


def test_a_batch_generated_in_this_run_that_misses_its_step_is_a_bug_not_a_warning():
    from gepo_xtuner.rollout import RolloutRequest
    ahead = RolloutAhead(EchoBackend())
    ahead.launch(2, 1, ['p0'], [RolloutRequest([1, 5])], PARAMS)
    pending, dropped = ahead.take(2, ['p0'], PARAMS)
    assert dropped is None and pending.version == 1 and len(pending.samples[0]) == 2
    assert all(s.weight_version == 1 for s in pending.samples[0])
    ahead.launch(3, 2, ['p0'], [RolloutRequest([1, 5])], PARAMS)
    with pytest.raises(RuntimeError, match="does not fit step 4: it answers prompts"):
        ahead.take(3, ['p1'], PARAMS)


def test_a_checkpoint_saved_off_schedule_holds_this_ranks_batch_and_names_the_others():
    """One process: its own batch fills the entry, and nothing is missing (no warning)."""
    ahead = RolloutAhead(backend=None)
    ahead.load_state_dict(saved())
    ranks = [dict(rng=None)]
    ahead.complete(ranks)
    entry = ranks[0]['rollout_ahead']
    assert entry['step'] == 4 and entry['prompt_ids'] == ['p0']
