"""The real-server check of partial rollouts, shared by the engines' tests
(``tests/test_vllm/test_partial_vllm.py``, ``tests/test_rollout/test_lmdeploy_partial.py``).

:func:`push_during_long_responses` drives the streaming stage with
``partial_rollout=True`` in the loop's call order over a backend attached to a real
server: each "update" perturbs the tiny policy and pushes it (a real push, checked by
the backend's probe); each version's weights are kept, so every trained token can be
scored by the trainer under the version it is labelled with. It checks that every
token's logprob is that version's (and not the next one's), that responses are whole
(``new_tokens`` tokens: nothing lost or repeated at a cut), that versions never decrease
along a response and no token is more than ``k`` versions old, and that pushes did land
during responses.
"""

import copy
import itertools
import time
from contextlib import nullcontext
from types import SimpleNamespace

import torch

from gepo_xtuner.engine.step.batching import Rollouts, build_response_batch
from gepo_xtuner.engine.step.rollout_stage import build_rollout_stage
from gepo_xtuner.engine.train_cfg import StageSettings
from gepo_xtuner.rollout import RolloutRequest, SamplingParams


def scored(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """The trainer's ``log p(response[t] | prompt, response[:t])`` (float32)."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def perturb(model, seed: int, scale: float = 0.02) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)


class StreamProgress:
    """Counts the lines of streamed answers as they arrive (wraps the HTTP client's
    reader of server-sent events while installed), so the check can push once responses
    in flight have tokens, not merely once their requests were sent."""

    def __init__(self) -> None:
        self.lines = 0
        self._reader = None

    def __enter__(self) -> 'StreamProgress':
        from gepo_xtuner.rollout.server import http
        self._reader = reader = http._events

        def counted(resp):
            lines = resp.iter_lines

            def iter_lines():
                for line in lines():
                    self.lines += 1
                    yield line
            resp.iter_lines = iter_lines
            return reader(resp)
        http._events = counted
        return self

    def __exit__(self, *exc) -> None:
        from gepo_xtuner.rollout.server import http
        http._events = self._reader


def update(backend, stage, progress: StreamProgress, streamed: bool, settle_s: float = 0.05,
           limit_s: float = 30.0) -> None:
    """The "update": returns once responses are being generated (a request on a server,
    and, for a streaming backend, some of their tokens received), or at once when the
    producer has nothing left to generate (at most ``limit_s``), so that the push comes
    in the middle of responses whatever the machine's speed (a faster producer would
    otherwise be parked at the bound, or not yet have tokens, when the push comes)."""
    deadline = time.monotonic() + limit_s
    start = progress.lines
    while time.monotonic() < deadline:
        if backend._pool.busy_servers():
            if not streamed or progress.lines - start >= 8:
                time.sleep(settle_s)
                return
        else:
            with stage._cv:
                if stage._job() is None and not stage._busy():
                    return
        time.sleep(0.002)


def push_during_long_responses(backend, model, *, k: int = 2, steps: int = 5,
                               groups: int = 8, n: int = 4, new_tokens: int = 96,
                               groups_in_flight: int = 2, tolerance: float = 1e-3,
                               streamed: bool = False, most_steps: int | None = None) -> dict:
    """Runs the check (the backend attached to ``model``, whose weights the server holds;
    ``streamed``: it streams its answers, and the push waits for some of their tokens).
    ``most_steps``: after ``steps`` steps without a response cut by a push, goes on up to
    this many (a server that serves the abort late, e.g. behind its streams, cuts nothing
    at some pushes); every step run is checked.

    Returns:
        ``dict(cut=responses continued across a push, worst=largest logprob gap)``.
    """
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=new_tokens,
                            stop_token_ids=())
    versions = [copy.deepcopy(model.state_dict())]
    source = ([dict(id=100 * s + i) for i in range(groups)] for s in itertools.count())
    prompts: dict[int, list[int]] = {}

    def encode(records):
        for r in records:
            prompts[r['id']] = [1, 4 + r['id'] % 40, 5 + r['id'] % 7]
        return [RolloutRequest(prompts[r['id']], extra={'ignore_eos': True}) for r in records]

    most = max(steps, most_steps or steps)
    stage = build_rollout_stage(StageSettings(k, partial_rollout=True,
                                              groups_in_flight=groups_in_flight),
                                backend, source, encode, lambda: 11, max_steps=most)
    stage.start()
    trained = []
    progress = StreamProgress().__enter__()
    try:
        for step in range(most):
            if step >= steps and any(len(set(s.versions())) > 1
                                     for *_, samples, _ in trained for g in samples for s in g):
                break  # a push has cut a response: enough steps
            records = stage.next_records()
            samples, _, _ = stage.responses(step, records, stage.encode(records), params,
                                            step + 1 == most)
            update(backend, stage, progress, streamed)
            stage.before_sync(lambda name: nullcontext())
            perturb(model, seed=step)
            backend.update_weights(model)  # a real push, checked by the probe
            versions.append(copy.deepcopy(model.state_dict()))
            batch = build_response_batch([prompts[r['id']] for r in records], samples, 0)
            metrics = stage.step_metrics(step, Rollouts(records, samples, batch, 0, 1.0), 1.0)
            trained.append((step, records, samples, metrics))
            stage.end_step(SimpleNamespace(hooks=[], iter=step), most, [{}])
    finally:
        progress.__exit__()
        stage.finish()
    scorer = copy.deepcopy(model)
    cut, worst = 0, 0.0
    for step, records, samples, metrics in trained:
        assert metrics['rollout/staleness_max'] <= k
        for record, group in zip(records, samples):
            assert len(group) == n
            for sample in group:
                assert sample.finish_reason == 'length'
                assert len(sample.response_ids) == new_tokens
                labels = sample.versions()
                assert labels == sorted(labels) and all(0 <= step - v <= k for v in labels)
                cut += len(set(labels)) > 1
                for v in sorted(set(labels)):
                    mine = [t for t, u in enumerate(labels) if u == v]
                    got = torch.tensor(sample.logprobs)[mine]
                    scorer.load_state_dict(versions[v])
                    want = scored(scorer, prompts[record['id']], sample.response_ids)[mine]
                    worst = max(worst, (got - want).abs().max().item())
                    scorer.load_state_dict(versions[v + 1])  # the next one does not fit
                    other = scored(scorer, prompts[record['id']], sample.response_ids)[mine]
                    assert (got - other).abs().max().item() > 10 * tolerance
    assert worst < tolerance, worst  # each token's logprob is its own version's
    assert cut > 0, 'no push landed during a response; the check needs one'
    assert sum(m['rollout/partial_responses'] for *_, m in trained) == cut
    return dict(cut=cut, worst=worst)
