"""Partial rollouts in the streaming stage (``train_cfg.partial_rollout``): a weight push
cuts the responses in flight, which are continued from their tokens on the new weights.

The stage is driven in the loop's call order with a stand-in engine that samples one
token at a time and can be preempted as :meth:`RolloutBackend.preempt` says: each token's
id is its position in the response and its logprob names the weights that sampled it,
so a lost, repeated or mislabelled token shows. Then the in-process backend's preemption
on the tiny policy (its cut tokens' logprobs are the policy's), and a real ``xtuner
train`` run with partial rollouts on. The real-server test is in
``tests/test_vllm/test_partial_vllm.py``.
"""

import itertools
import json
import threading
import time

import pytest
import torch
from mmengine.logging import MMLogger

from gepo_xtuner.engine.step.rollout_stage import RolloutStageStream, build_rollout_stage
from gepo_xtuner.engine.train_cfg import StageSettings
from gepo_xtuner.rollout import RolloutRequest, RolloutSample, SamplingParams

from .conftest import scalars, train, write_config
from .test_stream import drive as stream_drive

STOP = 2
LENGTH = 12  # every response: 11 tokens, then the stop token
PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=16, stop_token_ids=(STOP, ))
B = 3


def logprob(weights: int, position: int) -> float:
    """The stand-in's logprob of the token at ``position`` under ``weights``."""
    return -(weights + 1) - position / 100


class TokenBackend:
    """A stand-in engine that samples a token every ``delay`` seconds: token ``t`` of a
    response is ``1000 + t`` (the stop token at ``t = LENGTH - 1``), its logprob
    :func:`logprob` of the weights held when it was sampled. A prompt is ``[record id]``
    followed by the tokens so far, so a continuation goes on at the right position.
    :meth:`preempt` ends the calls begun before it after their current token."""

    concurrent_generate = True

    def __init__(self, delay: float = 0.002, slots: int | None = None,
                 uneven: bool = False) -> None:
        self.weights = 0
        self.delay = delay
        self.slots = slots
        self.uneven = uneven
        self.epoch = 0
        self.calls: list[dict] = []
        self.lock = threading.Lock()

    def request_slots(self) -> int | None:
        return self.slots

    def prepare_overlap(self) -> None:
        pass

    def prepare_partial(self) -> None:
        pass

    def preempt(self) -> None:
        self.epoch += 1

    def generate(self, requests, params):
        """Every response of the call side by side, one tick of ``delay`` at a time;
        response ``j`` of a request samples a token every ``j + 1`` ticks when
        ``uneven`` (a cut leaves them at different lengths, as an engine's chunked streams
        do), else every tick."""
        epoch, began = self.epoch, time.perf_counter()
        rows = [dict(at=len(r.input_ids) - 1, ids=[], lps=[], reason=None,
                     every=j + 1 if self.uneven else 1)
                for r in requests for j in range(params.n)]
        tick = 0
        while any(row['reason'] is None for row in rows):
            cut = self.epoch != epoch
            if not cut:
                time.sleep(self.delay)
                tick += 1
            for row in rows:
                if row['reason'] is not None or (not cut and tick % row['every']):
                    continue
                if cut or len(row['ids']) == params.max_new_tokens:
                    row['reason'] = 'abort' if cut else 'length'
                    continue
                t = row['at'] + len(row['ids'])
                row['ids'].append(STOP if t == LENGTH - 1 else 1000 + t)
                row['lps'].append(logprob(self.weights, t))
                if row['ids'][-1] == STOP:
                    row['reason'] = 'stop'
        samples = [RolloutSample(row['ids'], row['lps'], row['reason']) for row in rows]
        with self.lock:
            self.calls.append(dict(prompts=[r.input_ids for r in requests], n=params.n,
                                   cap=params.max_new_tokens, seed=params.seed,
                                   start=began, end=time.perf_counter()))
        return [samples[i:i + params.n] for i in range(0, len(samples), params.n)]


def source():
    return ([dict(id=100 * step + i) for i in range(B)] for step in itertools.count())


def make(backend, steps: int, k: int = 2, workers: int = 1) -> RolloutStageStream:
    return build_rollout_stage(StageSettings(k, partial_rollout=True, groups_in_flight=workers),
                               backend, source(),
                               lambda records: [RolloutRequest([r['id']]) for r in records],
                               lambda: 7, max_steps=steps)


def drive(stage, backend, steps: int, first: int = 0, train_seconds: float = 0.03):
    """``test_stream.drive`` with this file's sampling and an update of ``train_seconds``."""
    return stream_drive(stage, backend, steps, first, train_seconds, PARAMS)


def check_whole_and_labelled(seen, k: int) -> int:
    """Every trained response is whole (positions 0..LENGTH-1, each once, ending with the
    stop token), each token's logprob is that of the version it is labelled with, the
    versions never decrease along a response, and no token is more than ``k`` versions
    old. Returns how many responses were continued across a push."""
    continued = 0
    for row in seen:
        s = row['step']
        for group in row['samples']:
            assert len(group) == PARAMS.n
            for sample in group:
                assert sample.finish_reason == 'stop'
                assert sample.response_ids == [1000 + t for t in range(LENGTH - 1)] + [STOP]
                versions = sample.versions()
                assert versions == sorted(versions) and versions[0] == sample.weight_version
                assert sample.logprobs == pytest.approx(
                    [logprob(v, t) for t, v in enumerate(versions)], abs=1e-6)
                assert all(0 <= s - v <= k for v in versions), (s, versions)
                continued += len(set(versions)) > 1
        m = row['metrics']
        tokens = [v for g in row['samples'] for smp in g for v in smp.versions()]
        assert m['rollout/token_staleness'] == pytest.approx(
            sum(s - v for v in tokens) / len(tokens))
        assert m['rollout/staleness_max'] <= k
    return continued


@pytest.mark.parametrize('workers', [1, 2])
def test_a_push_cuts_responses_that_go_on_with_the_new_weights(workers):
    """Pushes land in the middle of responses (the producer is never between groups for
    long): cut responses are continued, nothing lost or repeated, every token keeps its
    version's logprob, and k bounds every token."""
    steps = 6
    backend = TokenBackend()
    stage = make(backend, steps, workers=workers)
    seen = drive(stage, backend, steps)
    assert [row['ids'] for row in seen] == [[100 * s + i for i in range(B)]
                                            for s in range(steps)]
    continued = check_whole_and_labelled(seen, 2)
    assert continued > 0  # the test did cut responses
    assert sum(row['metrics']['rollout/partial_responses'] for row in seen) == continued
    # each continuation asked for what was left, one response per request
    for call in backend.calls:
        if len(call['prompts'][0]) > 1:
            assert call['n'] == 1
            assert all(call['cap'] == PARAMS.max_new_tokens - (len(p) - 1)
                       for p in call['prompts'])


def test_a_groups_continuations_with_different_budgets_run_at_once():
    """Responses of a group cut at different lengths (the uneven stand-in), so the group is continued with one call per remaining budget
    (seeds ``c = 0, 1, ...`` of one job). On a backend that takes concurrent calls those
    calls run at once: in turn, the group would wait for the sum of their lengths."""
    steps = 6
    backend = TokenBackend(delay=0.004, uneven=True)
    stage = make(backend, steps, workers=1)
    check_whole_and_labelled(drive(stage, backend, steps), 2)
    continuing = [c for c in backend.calls if len(c['prompts'][0]) > 1 or c['n'] == 1]
    jobs = [(a, b) for a, b in itertools.combinations(continuing, 2)
            if a['prompts'][0][0] == b['prompts'][0][0] and abs(a['seed'] - b['seed']) == 1]
    assert jobs, 'no group was cut with two remaining budgets; the test needs one'
    for a, b in jobs:
        assert a['cap'] != b['cap']
        assert a['start'] < b['end'] and b['start'] < a['end'], 'the calls ran in turn'


@pytest.mark.parametrize('slots,partial,per_response,warned', [
    (3, True, False, True), (4, True, False, False), (None, True, False, False),
    (3, False, True, True), (3, False, False, False)])
def test_too_few_request_slots_for_the_groups_in_flight_are_logged(capsys, slots, partial,
                                                                   per_response, warned):
    """Two groups in flight of two responses may send four requests at once: with partial
    rollouts (a cut group is continued with a request per response) or on a backend that
    sends a request per response (LMDeploy), else two. A backend with fewer slots makes
    some wait, which the run's log says with what to change."""
    # a logger of its own, so that its handler writes to this case's captured output
    MMLogger.get_instance(f'gepo-slots-test-{slots}-{partial}-{per_response}')
    backend = TokenBackend(slots=slots)
    backend.request_per_response = per_response
    stage = build_rollout_stage(StageSettings(2, partial_rollout=partial, groups_in_flight=2),
                                backend, source(),
                                lambda records: [RolloutRequest([r['id']]) for r in records],
                                lambda: 7, max_steps=2)
    drive(stage, backend, 2)
    out = capsys.readouterr()
    log = out.out + out.err
    assert ('may send 4 requests at once' in log and 'sends at most 3' in log
            and 'max_concurrency to 4' in log) == warned, log[-2000:]
    assert ('requests at once' in log) == warned


def test_cut_groups_in_a_checkpoint_are_continued_after_resume():
    """A checkpoint taken after a push that cut groups holds them with their tokens so far;
    a fresh stage restored from it continues them (the saved tokens, then the rest with
    the checkpoint's weights), so each response is whole and none is generated anew."""
    steps = 5
    backend = TokenBackend(delay=0.008)
    stage = make(backend, steps)
    drive(stage, backend, 2, train_seconds=0.05)
    state = stage.state_dict()
    cut = [g for g in state['groups'] if g['partial']]
    assert cut, 'no group was in flight at the push; the test needs one'
    kept = {(g['batch'], g['position']): g for g in state['groups']}
    resumed = TokenBackend()
    resumed.weights = 2
    fresh = make(resumed, steps)
    next(fresh.source), next(fresh.source)
    fresh.restore(dict(ranks=[dict(rollout_stream=state)]), dict(rollout_stream=state))
    seen = drive(fresh, resumed, steps, first=2)
    check_whole_and_labelled(seen, 2)
    for row in seen:
        for p, group in enumerate(row['samples']):
            saved = kept.get((row['step'], p))
            if saved is None:
                continue
            for sample, (ids, lps, _, versions) in zip(group, saved['samples']):
                assert sample.response_ids[:len(ids)] == ids.tolist()  # the saved prefix
                assert sample.logprobs[:len(lps)] == pytest.approx(lps.tolist())
    fresh_starts = [p[0] for c in resumed.calls for p in c['prompts'] if len(p) == 1]
    assert not {g['prompt_id'] for g in state['groups']} & set(fresh_starts)


def test_the_in_process_backend_hands_back_the_policys_tokens_when_preempted(tiny_dir):
    """``HFRolloutBackend.preempt`` on the tiny policy: a generation on another thread ends
    early, its responses cut with ``'abort'``, and each cut token's logprob is the one the
    policy gives it (teacher-forced, float32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gepo_xtuner.rollout import HFRolloutBackend
    model = AutoModelForCausalLM.from_pretrained(tiny_dir / 'model').float()
    tok = AutoTokenizer.from_pretrained(tiny_dir / 'model')
    backend = HFRolloutBackend()
    backend.attach(model, tok)
    backend.prepare_overlap()
    backend.prepare_partial()
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=100, stop_token_ids=())
    prompt = [1, 5, 9]
    out = {}
    steps = []
    def slow_step(*args) -> None:  # 10 ms a token: 1 s for the whole answer
        steps.append(1)
        time.sleep(0.01)

    slow = backend.model.register_forward_hook(slow_step)
    thread = threading.Thread(target=lambda: out.update(
        samples=backend.generate([RolloutRequest(prompt)], params)))
    thread.start()
    deadline = time.monotonic() + 60
    while len(steps) < 5 and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    backend.preempt()
    thread.join(60)
    slow.remove()
    [group] = out['samples']
    assert all(s.finish_reason == 'abort' and 0 < len(s.response_ids) < 100 for s in group)
    for s in group:
        ids = torch.tensor([prompt + s.response_ids])
        with torch.no_grad():
            logits = backend.model(ids).logits[0, len(prompt) - 1:-1].float()
        expected = torch.log_softmax(logits, -1).gather(
            -1, torch.tensor(s.response_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(s.logprobs), expected, atol=1e-4)
    again = backend.generate([RolloutRequest(prompt)], replace_n(params, 1, 3))
    assert again[0][0].finish_reason == 'length'  # a later call is not cut


def replace_n(params: SamplingParams, n: int, max_new_tokens: int) -> SamplingParams:
    from dataclasses import replace
    return replace(params, n=n, max_new_tokens=max_new_tokens)


def test_a_run_with_partial_rollouts_trains_and_logs_them(tiny_dir, tmp_path):
    """``xtuner train`` with ``max_staleness=2, partial_rollout=True`` on the in-process
    backend: every step trains, with the token staleness logged within the bound."""
    run = tmp_path / 'run'
    train(write_config(tmp_path), run, tiny_dir, 'train_cfg.max_staleness=2',
          'train_cfg.partial_rollout=True', 'train_cfg.max_steps=3', 'train_cfg.val=None')
    logged = scalars(run)
    assert sorted(logged) == [1, 2, 3]
    for t, m in logged.items():
        assert 0 <= m['rollout/token_staleness'] <= m['rollout/staleness_max'] <= min(2, t - 1)
        assert m['rollout/partial_responses'] >= 0 and m['loss/pg'] == m['loss/pg']


def test_a_restored_cut_group_too_old_for_k_is_generated_again():
    """A cut group restored from a checkpoint written with a larger ``max_staleness``, whose
    first tokens would be more than ``k`` versions old at its step, is not continued: it
    is generated anew (the drop rule cannot reach it once a worker continues it)."""
    steps, first = 5, 3
    backend = TokenBackend()
    backend.weights = first
    stage = make(backend, steps)
    for _ in range(first):
        next(stage.source)
    ids = torch.tensor([1000, 1001], dtype=torch.int32)
    cut = (ids, torch.tensor([-1.0, -1.01]), 'abort', torch.tensor([0, 0], dtype=torch.int32))
    state = dict(step=first, max_staleness=4, sampling=None,
                 groups=[dict(batch=3, position=0, prompt_id=300, version=0, seconds=0.1,
                              partial=True, segments=0, samples=[cut] * PARAMS.n)])
    stage.restore(dict(ranks=[dict(rollout_stream=state)]), dict(rollout_stream=state))
    seen = drive(stage, backend, steps, first=first)
    check_whole_and_labelled(seen, 2)
    assert [p for c in backend.calls for p in c['prompts'] if p[0] == 300] == [[300]]


def test_a_cut_response_that_cannot_be_continued_ends_as_the_cap_would():
    """Cut exactly at the cap, it is a 'length' response; with an image placeholder among
    its tokens (a prompt with images), it ends before the placeholder."""
    from gepo_xtuner.engine.step.stream import _settle
    params = SamplingParams(n=1, max_new_tokens=3)
    full = RolloutSample([5, 6, 7], [-1.0, -2.0, -3.0], 'abort', 0, [0, 0, 1])
    assert _settle(full, RolloutRequest([1]), params).finish_reason == 'length'
    short = RolloutSample([5, 9, 7], [-1.0, -2.0, -3.0], 'abort', 0, [0, 0, 0])
    assert _settle(short, RolloutRequest([1]), replace_n(params, 1, 8)) is short
    image = RolloutRequest([1, 9], images=['x.png'], image_token_id=9)
    ended = _settle(short, image, replace_n(params, 1, 8))
    assert (ended.response_ids, ended.logprobs, ended.finish_reason, ended.token_versions) == \
        ([5], [-1.0], 'length', [0])


PARTIAL = ['train_cfg.max_staleness=2', 'train_cfg.partial_rollout=True',
           'train_cfg.max_steps=4', 'train_cfg.val=None',
           'train_cfg.rollout.type=SlowRecordingRolloutBackend', 'train_cfg.rollout.token_s=0.04',
           'default_hooks.checkpoint.interval=1', 'default_hooks.checkpoint.max_keep_ckpts=-1']


def test_xtuner_train_resumed_with_cut_groups_continues_them(tiny_dir, tmp_path, monkeypatch):
    """``xtuner train`` with partial rollouts on a backend slower than the update (every
    push cuts a group), resumed from the checkpoint of step 2, which holds cut groups: the
    resumed run trains at steps 3 and 4 the records the straight run trained then, each
    prompt once over the two runs; each saved cut response is continued from its saved
    tokens (a call of one response whose prompt ends with them), and only the groups the
    checkpoint lacks are generated from their prompt."""
    from .test_stream import HOOKS, trained
    monkeypatch.setenv('GEPO_TEST_GENERATE_LOG', str(tmp_path / 'straight.log'))
    straight = tmp_path / 'straight'
    train(write_config(tmp_path, extra=HOOKS), straight, tiny_dir, *PARTIAL)
    ckpt = straight / 'iter_2.pth'
    saved = torch.load(ckpt, map_location='cpu', weights_only=False)[
        'gepo_xtuner/rl_loop']['ranks'][0]['rollout_stream']
    cut = [g for g in saved['groups'] if g['partial']]
    assert cut, 'no group was in flight at the push of step 2; the test needs one'
    log = tmp_path / 'resumed.log'
    monkeypatch.setenv('GEPO_TEST_GENERATE_LOG', str(log))
    resumed = tmp_path / 'resumed'
    train(write_config(tmp_path, extra=HOOKS), resumed, tiny_dir, *PARTIAL, '--resume',
          str(ckpt))
    before, after = trained(straight), trained(resumed)
    assert sorted(after) == [3, 4] and [after[3], after[4]] == [before[3], before[4]]
    everything = before[1] + before[2] + after[3] + after[4]
    assert len(everything) == len(set(everything))  # each prompt exactly once
    calls = [json.loads(line) for line in open(f'{log}.0')]
    continued = [ids for c in calls if c['n'] == 1 for ids in c['ids']]
    for group in cut:
        for tokens, _, reason, _ in group['samples']:
            if reason == 'abort' and len(tokens):
                tail = tokens.tolist()
                assert any(ids[-len(tail):] == tail for ids in continued), tail
    fresh = sum(c['prompts'] for c in calls if c['n'] > 1)
    assert fresh == 2 * len(before[3]) - len(saved['groups'])
    logged = scalars(resumed)
    assert all(logged[t]['rollout/staleness_max'] <= 2 for t in (3, 4))


def test_two_ranks_with_partial_rollouts_train_each_prompt_once_with_one_band(
        tiny_dir, tmp_path, monkeypatch):
    """Two gloo ranks, each streaming its own groups (cut at every push by the slow
    backend) with its own seed: every step trains on each rank, the ranks' prompts are
    disjoint and each trained once, and the GEPO band, reduced over the ranks' groups of
    the step, is the same on both."""
    from .conftest import train_ranks
    monkeypatch.setenv('GEPO_TEST_GENERATE_LOG', str(tmp_path / 'generate.log'))
    hooks = ("custom_hooks = [dict(type='TrainedPromptsHook'), "
             "dict(type='DumpAdvantageStateHook')]")
    work = tmp_path / 'run'
    out = train_ranks(write_config(tmp_path, extra=hooks), work, tiny_dir, 2, *PARTIAL,
                      'randomness.diff_rank_seed=True')
    assert (work / 'iter_4.pth').exists(), out[-6000:]
    ids = [[json.loads(line) for line in open(work / f'trained_rank{r}.jsonl')]
           for r in (0, 1)]
    assert [[row['step'] for row in rank] for rank in ids] == [[1, 2, 3, 4]] * 2
    every = [i for rank in ids for row in rank for i in row['ids']]
    assert len(every) == len(set(every))
    states = [[json.loads(line) for line in open(work / f'state_rank{r}.jsonl')]
              for r in (0, 1)]
    assert [row['state'] for row in states[0]] == [row['state'] for row in states[1]]
    assert states[0][-1]['state']  # GEPO's band was kept
    logged = scalars(work)
    assert all(logged[t]['rollout/staleness_max'] <= 2 for t in range(1, 5))
    assert sum(logged[t].get('rollout/partial_responses', 0) for t in range(1, 5)) > 0
