"""Streaming generation, k batches ahead of the update: ``train_cfg.max_staleness = k >= 2``.

A producer (one worker thread) generates groups (one prompt's K responses) one after
another, each with the weights the rollout backend holds when the group starts, and
stamps it with that weight version; the RL loop's step ``s`` trains on the B groups of
its batch (this rank's source batch ``s``, the records the synchronous loop would
train at step ``s``) once all of them are complete, the groups that were generated
earliest first. Timeline (k = 2; ``v`` = the version the backend holds)::

    main thread:  take batch s | reward | advantage | update | pause | push v=s+1 | resume
    producer:     ... groups of batches s+1, s+2 (v = s) ...  |parked|  ... s+3 (v = s+1)

The rules:

- **Version.** ``v`` counts the updates the backend holds: the weights of step ``s``
  (before its update) are version ``s``; a group's staleness when step ``s`` trains it is
  ``s - v``.
- **Pacing (the bound).** The producer starts a group of batch ``j`` only while the
  backend holds a version ``v >= j - k``, and only for ``j < max_steps``; so a trained
  group is never more than ``k`` versions old, and the buffer of complete, untrained
  groups holds at most ``k`` batches after a step took its own (``(k + 1) * B`` while
  the step waits). A producer faster than the trainer parks at the bound; one slower
  than the trainer leaves the step waiting for its batch (``time/rollout``).
- **Too old.** A group with ``s - v > k`` at the step ``s`` that would train it is
  dropped, and its prompt generated again with the current weights, first in the
  producer's order; counted per step in ``rollout/dropped_stale``. By the pacing this
  never happens within a run: it catches groups restored from a checkpoint written with
  a larger ``max_staleness``.
- **Whole groups, one version** (default). Before each weight push the main thread
  pauses the producer and waits until no group is in flight
  (:meth:`RolloutStageStream.before_sync`, ``time/rollout_pause_wait``); it resumes once
  the push (and any validation, which uses the same backend) is done, at the end of the
  step. Every group is one :meth:`~gepo_xtuner.rollout.RolloutBackend.generate` call of
  one request, so every response of a group comes from one version.
- **Partial rollouts** (``partial_rollout=True``). Before each push the main thread
  preempts the backend (:meth:`~gepo_xtuner.rollout.RolloutBackend.preempt`) instead of
  waiting:
  each response in flight ends where it is (``finish_reason='abort'``) and keeps its
  tokens and their logprobs, all sampled by the version the group's call started under
  (the push waits until none of those requests runs). After the push the producer
  continues every cut response from its tokens so far (the prompt plus those tokens, at
  most ``max_new_tokens`` in all) with the new weights, first in its order, and appends
  what comes back, stamped with the new version: ``RolloutSample.token_versions`` holds
  each token's version, and each token's logprob is the one its own version gave it.
  Nothing trained is dropped or duplicated (a server that streams in chunks and dropped
  the tokens it had not sent at the cut would sample those again; vLLM 0.32 sends them
  with the abort); a group is trained only once all
  its responses ended by a stop token or the length cap. The group's oldest tokens are its first, so
  the pacing bound holds per token: no trained token is more than ``k`` versions old.
  Continuations of responses with different remaining budgets go in separate calls,
  which run at once on a backend that takes concurrent calls (the server backends).
- **Several groups in flight** (``groups_in_flight=g``): ``g`` worker threads take the
  next groups in the same order, each one job at a time (a new group, or the continuation
  calls of a cut one) (server backends).
- **Checkpoint.** A checkpoint saved at the end of step ``s`` holds the producer's
  complete, untrained groups (batches ``s + 1 .. s + k``) as samples: token ids,
  logprobs, finish reasons, weight version, with the batch and position they answer and
  the record's ``id``; with partial rollouts also the groups cut at that step's push
  (their responses so far, with each token's version), which a resumed run continues
  with the checkpoint's weights, as the uninterrupted run does after the push. Groups
  not started are generated after ``--resume`` (with the checkpoint's weights, so
  possibly fresher than the uninterrupted run's). A resumed run re-draws its batches
  from the data position of the step (as every stage does), matches each saved group to
  its batch and position by the record id, and trains every prompt exactly once: batch
  ``s`` at step ``s``.
- **Reproducibility.** Which version each group gets depends on thread timing (how far
  the producer got before each push), so the versions, and hence the trained responses
  and weights, may differ between two runs with the same seed. What is fixed: the
  records of every step (batch ``s`` at step ``s``, as the synchronous loop), and each
  group's sampling seed, a function of the run's seed, the rank, the batch and the
  position (:func:`group_seed`); the in-process backend samples from a private
  generator seeded with it, so a group's responses are a function of (its weights, its
  prompt, its seed): given the versions, the content is deterministic. Servers that
  ignore the seed are not.

The producer calls nothing but :meth:`~gepo_xtuner.rollout.RolloutBackend.generate`
(no collective, no tokenizer): the main thread draws and encodes the batches the
producer may reach, at the first step and at the end of every step.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

import torch
from mmengine.logging import print_log

from ...ops.distributed import dist_rank, dist_world_size
from ...rollout import RolloutRequest, SamplingParams
from ...rollout.base import RolloutBackend, RolloutSample
from ..runtime.mmengine_private import checkpoint_due
from ..state.run_state import gather_to_first
from .batching import Rollouts
from .overlap import ahead_seed, sampling_signature, stamp

__all__ = ['RolloutStageStream', 'group_seed']

Samples = list[list[RolloutSample]]
#: the run-state key of a rank's saved groups
STATE_KEY = 'rollout_stream'


def group_seed(seed: int | None, rank: int, batch: int, position: int) -> int:
    """The private sampling seed of the group answering prompt ``position`` of batch
    ``batch`` on ``rank``: a pure function of the run's seed, so a regenerated group (a
    resume, a drop) samples with the seed the first try had."""
    return (ahead_seed(seed, rank, batch) * 1_000_003 + position) % 2**63


@dataclass
class _Slot:
    """One prompt of a drawn batch and, once generated, its group.

    Attributes:
        record_id: the record's ``id`` (what a restored group is matched by).
        request: its encoded rollout request.
        group: the K responses, each stamped with ``version``; None until complete.
        version: the weight version the group was sampled with.
        seconds: wall time of the group's ``generate`` calls.
        busy: the producer is generating it now.
        parts: partial rollouts: the K responses so far of a group cut by a push (those
            with ``finish_reason='abort'`` are continued); None: not cut.
        segments: the continuation calls made so far (they number the calls' seeds).
    """

    record_id: Any
    request: RolloutRequest
    group: list[RolloutSample] | None = None
    version: int = -1
    seconds: float = 0.0
    busy: bool = False
    parts: list[RolloutSample] | None = None
    segments: int = 0


class RolloutStageStream:
    """Streaming generation with up to ``max_staleness = k >= 2`` versions in flight.

    Answers the RL loop's calls as :class:`~gepo_xtuner.engine.step.rollout_stage.RolloutStage`
    does (same order, same returns); what differs is where the responses come from (the
    module docstring's rules).

    Args:
        backend: a rollout backend that can overlap (``check_overlap()``), prepared with
            ``prepare_overlap()`` in :meth:`start`.
        source: the step records, one list of B prompt records per step.
        encode: records -> rollout requests (main thread only).
        seed: returns the run's seed (read when a group is sampled).
        max_staleness: ``k >= 1``, the most versions a trained group may be behind.
        max_steps: the run's last step + 1: no batch at or past it is drawn or generated.
        partial: partial rollouts (``train_cfg.partial_rollout``): a push cuts the groups
            in flight, which continue on the new weights.
        workers: groups generated at once (``train_cfg.groups_in_flight``).
    """

    def __init__(self, backend: RolloutBackend, source: Iterator[list[dict]],
                 encode: Callable[[list[dict]], list[RolloutRequest]],
                 seed: Callable[[], int | None], max_staleness: int, max_steps: int,
                 partial: bool = False, workers: int = 1) -> None:
        self.backend = backend
        self.source = source
        self.encode = encode
        self.seed = seed
        self.max_staleness = max_staleness
        self.max_steps = max_steps
        self.partial = partial
        self.workers = workers
        self._cv = threading.Condition()
        # batch index -> (records, slots); batches [_next, _drawn) are drawn, not trained
        self._batches: dict[int, tuple[list[dict], list[_Slot]]] = {}
        self._next: int | None = None  # the step that takes next (None: not started)
        self._drawn = 0  # batches drawn so far (index of the next one to draw)
        self._version = 0  # updates the backend holds
        self._params: SamplingParams | None = None
        self._paused = False
        self._stop = False
        self._error: BaseException | None = None
        self._threads: list[threading.Thread] = []
        self._saved: dict[str, Any] | None = None  # restored, applied at the first step
        self._taken: dict[str, float] = {}  # the last take's figures, for step_metrics

    # -- the loop's calls -----------------------------------------------------------------
    def start(self) -> None:
        """Prepares the backend; the producer starts at the first step (the loop skips the
        data already trained after this call, on ``--resume``)."""
        self.backend.prepare_overlap()
        if self.partial:
            self.backend.prepare_partial()

    def next_records(self) -> list[dict]:
        """Batch ``s``'s records: drawn now at the first step, else drawn ahead."""
        if self._next is None:
            return next(self.source)
        with self._cv:
            return self._batches[self._next][0]

    def responses(self, step: int, records: list[dict], requests: list[RolloutRequest],
                  params: SamplingParams, last: bool) -> tuple[Samples, int, float | None]:
        """Waits until every group of batch ``step`` is complete and takes them.

        At the first step (of a run or after ``--resume``) it also draws and encodes the
        batches the producer may reach, places the groups a checkpoint saved, and starts
        the producer.

        Returns:
            ``(samples, oldest version, generation seconds)``: ``samples[b]`` the group of
            ``records[b]``, each response stamped with its group's version; the seconds
            are the sum of the groups' ``generate`` calls.
        """
        if self._next is None:
            self._begin(step, records, requests, params)
        if step != self._next:
            raise RuntimeError(f'RolloutStageStream: step {step + 1} asked, but batch '
                               f'{self._next + 1} is next')
        k = self.max_staleness
        with self._cv:
            _, slots = self._batches[step]
            dropped = 0
            for slot in slots:  # too old: generated again now, first in the producer's order
                started = slot.group is not None or slot.parts is not None
                if started and not slot.busy and step - slot.version > k:
                    slot.group, slot.parts, dropped = None, None, dropped + 1
            if dropped:
                self._cv.notify_all()
            while not all(slot.group is not None for slot in slots):
                self._raise_error()
                self._cv.wait()
            del self._batches[step]
            self._next = step + 1
            buffered = sum(s.group is not None for _, ss in self._batches.values() for s in ss)
        if dropped:
            print_log(f'step {step + 1}: {dropped} group(s) more than max_staleness={k} '
                      'versions old dropped and generated again with the current weights',
                      logger='current', level=logging.WARNING)
        samples = [slot.group for slot in slots]
        versions = [slot.version for slot in slots]
        self._taken = {'rollout/staleness': step - sum(versions) / len(versions),
                       'rollout/staleness_max': float(step - min(versions)),
                       'rollout/buffer_groups': float(buffered),
                       'rollout/dropped_stale': float(dropped)}
        if self.partial:
            self._taken.update(token_staleness(step, samples))
        return samples, min(versions), sum(slot.seconds for slot in slots)

    def before_sync(self, clock: Callable[[str], AbstractContextManager]) -> None:
        """Pauses the producer (no request in flight during the push): at the end of the
        groups it is generating, or, with partial rollouts, at once: the backend is
        preempted (again every 50 ms while a call that began just before the pause still
        runs), and the cut responses wait for the new weights."""
        with clock('rollout_pause_wait'):
            with self._cv:
                self._paused = True
                busy = self._busy()
            while busy and self.partial:
                self.backend.preempt()
                with self._cv:
                    self._raise_error()
                    self._cv.wait_for(lambda: not self._busy() or self._error is not None,
                                      timeout=0.05)
                    busy = self._busy()
            with self._cv:
                while self._busy():
                    self._raise_error()
                    self._cv.wait()
                self._raise_error()

    def discard(self) -> None:
        """Stops the producer (aborting a running generation) and drops what it held."""
        self._halt(abort=True)
        with self._cv:
            self._batches.clear()
            self._error, self._next = None, None

    def finish(self) -> None:
        """The run ended: stops the producer at the end of its group."""
        self._halt(abort=False)

    def step_metrics(self, step: int, rollouts: Rollouts, seconds: float) -> dict[str, float]:
        """``perf/gen_tokens[_per_sec]`` (over the groups' own generation time: the sum of
        their calls, which overlap with ``groups_in_flight > 1``, so then it is the tokens
        per call-second, not per second of wall time), and
        ``rollout/staleness`` (mean over the batch's groups of ``step - version``),
        ``rollout/staleness_max``, ``rollout/buffer_groups`` (complete, untrained groups
        after the take, at most ``k * B``), ``rollout/dropped_stale`` (groups dropped at
        this step as too old) and ``time/rollout_generate``."""
        new_tokens = int(rollouts.batch.response_mask.sum())
        generation = seconds if rollouts.seconds is None else rollouts.seconds
        return {'perf/gen_tokens': float(new_tokens),
                'perf/gen_tokens_per_sec': new_tokens / max(generation, 1e-9),
                **self._taken, 'time/rollout_generate': generation}

    def end_step(self, runner: Any, max_steps: int, ranks: list[dict[str, Any]]) -> None:
        """After the push: the backend holds version ``step + 1``; draws (and encodes) the
        batches that version lets the producer reach, gathers the saved groups at the
        steps the ``CheckpointHook`` saves at (while the producer is parked: a consistent
        set), then resumes the producer. A collective (every rank calls it)."""
        with self._cv:
            self._version = self._next
        self._draw()
        if checkpoint_due(runner, max_steps):
            self.gather(ranks)
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    # -- run state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's complete, untrained groups and, with partial rollouts, its cut ones
        (a consistent snapshot; the producer may go on): ``step`` (the next step),
        ``max_staleness``, ``sampling`` and ``groups``, a list of ``dict(batch, position,
        prompt_id, version, seconds, partial, segments, samples)`` with the samples as
        ``(int32 ids, float32 logprobs, finish reason, int32 token versions or None)``."""
        with self._cv:
            if self._next is None and self._saved is not None:  # restored, not begun yet
                return self._saved
            groups = [dict(batch=j, position=p, prompt_id=slot.record_id, version=slot.version,
                           seconds=slot.seconds, partial=slot.group is None,
                           segments=slot.segments,
                           samples=[_pack(s) for s in slot.group or slot.parts])
                      for j, (_, slots) in sorted(self._batches.items())
                      for p, slot in enumerate(slots)
                      if slot.group is not None or (slot.parts is not None and not slot.busy)]
            return dict(step=self._next, max_staleness=self.max_staleness,
                        sampling=None if self._params is None
                        else sampling_signature(self._params), groups=groups)

    def gather(self, ranks: list[dict[str, Any]]) -> None:
        """Puts every rank's groups into ``ranks`` on rank 0; a collective."""
        for entry, state in zip(ranks, gather_to_first(self.state_dict()) or ()):
            entry[STATE_KEY] = state

    def complete(self, ranks: list[dict[str, Any]]) -> None:
        """For a checkpoint saved without :meth:`gather`: this process's own groups, and a
        warning naming the ranks whose groups are not in it."""
        if all(STATE_KEY in entry for entry in ranks):
            return
        if dist_rank() < len(ranks):
            ranks[dist_rank()][STATE_KEY] = self.state_dict()
        missing = [r for r, e in enumerate(ranks) if STATE_KEY not in e]
        if missing:
            print_log(f'this checkpoint lacks the streamed groups of ranks {missing} (saved '
                      "off the CheckpointHook's schedule; they are generated again on resume)",
                      logger='current', level=logging.WARNING)

    def restore(self, state: dict[str, Any], entry: dict[str, Any] | None) -> None:
        """Keeps this rank's saved groups for the first step (:meth:`responses` places
        them); names the ranks without any."""
        self._saved = None if entry is None else entry.get(STATE_KEY)
        missing = [r for r, e in enumerate(state.get('ranks', []))
                   if e.get(STATE_KEY) is None and r < dist_world_size()]
        if missing:
            print_log(f'the checkpoint holds no streamed groups for ranks {missing}: their '
                      "next batches are generated now with the checkpoint's weights",
                      logger='current', level=logging.WARNING)

    # -- the producer ---------------------------------------------------------------------
    def _begin(self, step: int, records: list[dict], requests: list[RolloutRequest],
               params: SamplingParams) -> None:
        """The first step: batch ``step`` (drawn by :meth:`next_records`) and the batches
        the backend's version ``step`` lets the producer reach, the saved groups, the
        producer."""
        self._params = params
        self._warn_slots(params.n)
        self._next = self._drawn = step
        self._version = step  # the loop pushed the checkpoint's weights on resume
        self._add_batch(records, requests)
        self._draw()
        self._place_saved(step, params)
        device = (torch.cuda.current_device()
                  if torch.cuda.is_available() and torch.cuda.is_initialized() else None)
        self._stop, self._paused, self._error = False, False, None
        self._threads = [threading.Thread(target=self._produce, args=(device, ),
                                          name=f'rollout-stream-{w}', daemon=True)
                         for w in range(self.workers)]
        for thread in self._threads:
            thread.start()

    def _warn_slots(self, n: int) -> None:
        """Warns when the backend's request slots cannot hold every request the workers
        may have in flight: ``groups_in_flight x n`` with partial rollouts (a cut group is
        continued with one request per response) or on a backend that sends a request per
        response (``request_per_response``, LMDeploy), else ``groups_in_flight``. The
        requests beyond the slots wait, and with them the groups they belong to (which
        then miss their step)."""
        slots = getattr(self.backend, 'request_slots', lambda: None)()
        per_response = self.partial or getattr(self.backend, 'request_per_response', False)
        need = self.workers * (n if per_response else 1)
        if slots is None or need <= slots:
            return
        why = ('a cut group is continued with one request per response' if self.partial
               else 'the backend sends one request per response')
        per_server = getattr(self.backend, 'max_concurrency', None)
        servers = slots // per_server if per_server else 1
        print_log(f'{self.workers} group(s) in flight of {n} responses may send {need} '
                  f'requests at once ({why}), but {type(self.backend).__name__} sends at most '
                  f'{slots}; the others wait for a slot and delay their groups. Raise its '
                  f'max_concurrency to {-(-need // servers)} (per server, {servers} '
                  'server(s)) or lower train_cfg.groups_in_flight',
                  logger='current', level=logging.WARNING)

    def _add_batch(self, records: list[dict], requests: list[RolloutRequest]) -> None:
        with self._cv:
            self._batches[self._drawn] = (records, [_Slot(r['id'], q)
                                                    for r, q in zip(records, requests)])
            self._drawn += 1
            self._cv.notify_all()

    def _draw(self) -> None:
        """Draws and encodes (main thread) every batch the producer may reach with the
        backend's version: up to ``version + k``, before ``max_steps``."""
        last = min(self._version + self.max_staleness, self.max_steps - 1)
        while self._drawn <= last:
            records = next(self.source)
            self._add_batch(records, self.encode(records))

    def _place_saved(self, step: int, params: SamplingParams) -> None:
        """Puts the restored groups into the slots they answer; drops (and logs) those
        that do not fit: sampled otherwise, another record at their place (a changed
        world size, batch size, dataset or data order), or a batch beyond what this
        run's ``max_staleness`` draws (they would be too old by then)."""
        saved, self._saved = self._saved, None
        if not saved or not saved.get('groups'):
            return
        now = sampling_signature(params)
        if saved.get('sampling') not in (None, now):
            print_log(f'the {len(saved["groups"])} streamed group(s) restored from the '
                      'checkpoint were sampled with other settings and are generated again',
                      logger='current', level=logging.WARNING)
            return
        placed, unfit = 0, 0
        with self._cv:
            for g in saved['groups']:
                batch = self._batches.get(g['batch'])
                slot = (batch[1][g['position']] if batch is not None
                        and g['position'] < len(batch[1]) else None)
                if slot is None or slot.record_id != g['prompt_id']:
                    unfit += 1
                    continue
                samples = [_unpack(packed, g['version']) for packed in g['samples']]
                if g.get('partial') and (not self.partial
                                         or g['batch'] - g['version'] > self.max_staleness):
                    # cut, and this run does not continue cut responses, or too old to be
                    # continued (its first tokens would be more than k versions old)
                    unfit += 1
                    continue
                if g.get('partial'):
                    slot.parts, slot.segments = samples, int(g.get('segments', 0))
                else:
                    slot.group = samples
                slot.version, slot.seconds = g['version'], float(g['seconds'])
                placed += 1
        print_log(f'resumed at step {step + 1}: {placed} streamed group(s) restored from the '
                  'checkpoint' + (f', {unfit} that no longer fit their batch (or lie beyond '
                                  f'max_staleness={self.max_staleness}) generated again'
                                  if unfit else ''),
                  logger='current', level=logging.WARNING if unfit else logging.INFO)

    def _busy(self) -> bool:
        return any(s.busy for _, slots in self._batches.values() for s in slots)

    def _job(self) -> tuple[int, int, _Slot] | None:
        """The next group to generate or continue: the first one not complete and not
        being generated, in (batch, position) order, whose batch the backend's version
        may reach (version >= batch - k; a cut group's batch always may)."""
        for j in sorted(self._batches):
            if j > self._version + self.max_staleness:
                return None
            for p, slot in enumerate(self._batches[j][1]):
                if slot.group is None and not slot.busy:
                    return j, p, slot
        return None

    def _produce(self, device: int | None) -> None:
        """A worker: one job at a time, a new group (one ``generate`` call) or the
        continuation of a cut one (:meth:`_generate`'s calls); parked while paused, at the
        bound, or with nothing drawn."""
        if device is not None:  # the current CUDA device is per thread
            torch.cuda.set_device(device)
        while True:
            with self._cv:
                while True:
                    if self._stop:
                        return
                    job = None if self._paused else self._job()
                    if job is not None:
                        break
                    self._cv.wait()
                j, p, slot = job
                slot.busy, version = True, self._version
            start = time.perf_counter()
            try:
                with self._cv:
                    seed = group_seed(self.seed(), dist_rank(), j, p)
                    if slot.parts is None:
                        calls = [([slot.request], replace(self._params, seed=seed), None)]
                    else:
                        calls = continuations(slot, self._params, seed)
                        slot.segments += 1
                answers = self._generate(calls)
            except BaseException as exc:  # noqa: BLE001 (re-raised on the main thread)
                with self._cv:
                    slot.busy, self._error = False, exc
                    self._cv.notify_all()
                return
            with self._cv:
                slot.busy = False
                slot.seconds += time.perf_counter() - start
                for out, which in answers:
                    if which is None:
                        [group] = out
                        if slot.parts is None and not any(_cut(s) for s in group):
                            slot.group, slot.version = stamp([group], version)[0], version
                        elif all(_cut(s) and not s.response_ids for s in group):
                            pass  # cut before its first token: started again later
                        else:
                            slot.version = version
                            slot.parts = [_extend(None, s, version) for s in group]
                    else:
                        for i, [sample] in zip(which, out):
                            slot.parts[i] = _extend(slot.parts[i], sample, version)
                if slot.parts is not None:
                    slot.parts = [_settle(s, slot.request, self._params) for s in slot.parts]
                if slot.parts is not None and not any(_cut(s) for s in slot.parts):
                    slot.group, slot.parts = slot.parts, None
                self._cv.notify_all()

    def _generate(self, calls: list[tuple[list[RolloutRequest], SamplingParams, Any]]
                  ) -> list[tuple[Samples, Any]]:
        """A job's ``generate`` calls: all at once on a backend that takes concurrent calls
        (a cut group whose responses have different remaining budgets is continued in one
        call per budget, and each call runs as long as its longest response: in turn, the
        group would take their sum), else one after another, the rest left for after the
        push once the producer is paused.

        Returns:
            ``(answer, which)`` per call made, in the order of ``calls``.

        Raises:
            What a call raised (the first one's error), once every call of the job ended.
        """
        if len(calls) > 1 and self.backend.concurrent_generate:
            with ThreadPoolExecutor(len(calls), thread_name_prefix='rollout-call') as pool:
                outs = list(pool.map(lambda call: self.backend.generate(call[0], call[1]),
                                     calls))
            return [(out, which) for out, (_, _, which) in zip(outs, calls)]
        answers = []
        for requests, params, which in calls:
            answers.append((self.backend.generate(requests, params), which))
            with self._cv:
                if self._paused or self._stop:  # the rest after the push
                    break
        return answers

    def _raise_error(self) -> None:
        """Re-raises (on the main thread, holding the lock) what the producer raised."""
        if self._error is not None:
            raise RuntimeError(f'the rollout stream\'s generation failed: {self._error}'
                               ) from self._error

    def _halt(self, abort: bool) -> None:
        """Stops and joins the producer (``abort``: cancels a running generation)."""
        if not self._threads:
            return
        with self._cv:
            self._stop = True
            busy = self._busy()
            self._cv.notify_all()
        abort_call = getattr(self.backend, 'abort', None)
        if abort and busy and abort_call is not None:
            abort_call()
        for thread in self._threads:
            thread.join()
        self._threads = []


def _cut(sample: RolloutSample) -> bool:
    """Whether a preemption ended ``sample`` before a stop token or the length cap."""
    return sample.finish_reason == 'abort'


def _settle(sample: RolloutSample, request: RolloutRequest, params: SamplingParams
            ) -> RolloutSample:
    """A cut response that cannot be continued, ended as the length cap would: one that
    already holds ``max_new_tokens`` tokens (cut just after its last one), or, for a
    prompt with images, one holding an image placeholder token, which the engine's
    prompt could not take back (it ends before it, as the loop's ``cut_at_tokens`` ends
    any response there). Other samples are returned as they are."""
    if not _cut(sample):
        return sample
    end = len(sample.response_ids)
    if request.images and request.image_token_id is not None \
            and request.image_token_id in sample.response_ids:
        end = sample.response_ids.index(request.image_token_id)
    elif end < params.max_new_tokens:
        return sample
    versions = sample.versions()[:end]
    return RolloutSample(sample.response_ids[:end], sample.logprobs[:end], 'length',
                         versions[0] if versions else sample.weight_version, versions)


def _extend(done: RolloutSample | None, more: RolloutSample, version: int) -> RolloutSample:
    """``done`` (None: nothing yet) followed by ``more``, sampled by ``version``: ids and
    logprobs concatenated, ``more``'s finish reason, each token's version."""
    versions = ([] if done is None else done.versions()) + [version] * len(more.response_ids)
    return RolloutSample(([] if done is None else done.response_ids) + more.response_ids,
                         ([] if done is None else done.logprobs) + more.logprobs,
                         more.finish_reason, versions[0] if versions else version, versions)


def continuations(slot: _Slot, params: SamplingParams, seed: int
                  ) -> list[tuple[list[RolloutRequest], SamplingParams, list[int]]]:
    """The calls that continue a cut group: its cut responses, each as one request whose
    prompt is the group's prompt followed by the response's tokens so far (``n=1``), one
    call per remaining budget ``max_new_tokens - tokens so far`` (largest first), seeded
    from the group's seed, the segment and the call.

    Returns:
        ``(requests, params, response indices)`` per call.
    """
    budgets: dict[int, list[int]] = {}
    for i, sample in enumerate(slot.parts):
        if _cut(sample):
            budgets.setdefault(params.max_new_tokens - len(sample.response_ids), []).append(i)
    calls = []
    for c, budget in enumerate(sorted(budgets, reverse=True)):
        which = budgets[budget]
        requests = [continued(slot.request, slot.parts[i].response_ids) for i in which]
        call_seed = (seed * 1_000_003 + 4099 * (slot.segments + 1) + c) % 2**63
        calls.append((requests, replace(params, n=1, max_new_tokens=budget, seed=call_seed),
                      which))
    return calls


def continued(request: RolloutRequest, tokens: list[int]) -> RolloutRequest:
    """``request`` with ``tokens`` appended to its prompt (every form of it)."""
    return replace(request, input_ids=list(request.input_ids) + list(tokens),
                   model_input_ids=None if request.model_input_ids is None
                   else list(request.model_input_ids) + list(tokens))


def token_staleness(step: int, samples: Samples) -> dict[str, float]:
    """``rollout/token_staleness`` (mean over the batch's response tokens of ``step -``
    the token's version) and ``rollout/partial_responses`` (responses whose tokens come
    from more than one version)."""
    total, tokens, partial = 0, 0, 0
    for group in samples:
        for sample in group:
            versions = sample.versions()
            total += sum(step - v for v in versions)
            tokens += len(versions)
            partial += len(set(versions)) > 1
    return {'rollout/token_staleness': total / max(tokens, 1),
            'rollout/partial_responses': float(partial)}


def _pack(sample: RolloutSample) -> tuple:
    """A sample as checkpointed: ``(ids, logprobs, finish reason, token versions)``."""
    return (torch.tensor(sample.response_ids, dtype=torch.int32),
            torch.tensor(sample.logprobs, dtype=torch.float32), sample.finish_reason,
            None if sample.token_versions is None
            else torch.tensor(sample.token_versions, dtype=torch.int32))


def _unpack(packed: tuple, version: int) -> RolloutSample:
    """:func:`_pack`'s tuple (or the 3-tuple of checkpoints without token versions) as a
    sample of the group's ``version``."""
    ids, lps, finish, *rest = packed
    versions = rest[0] if rest else None
    return RolloutSample(ids.tolist(), lps.tolist(), finish,
                         version if versions is None or not len(versions) else int(versions[0]),
                         None if versions is None else versions.tolist())
