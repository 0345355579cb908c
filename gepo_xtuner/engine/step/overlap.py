"""Generation one batch ahead of the update: ``train_cfg.max_staleness = 1``.

With ``max_staleness = 1`` the RL loop starts generating step ``i + 1``'s responses on a
worker thread as soon as step ``i``'s are in hand, and scores, shapes and trains step
``i`` meanwhile. Before it pushes the new weights it waits for the worker, so no request
is in flight during a push: every response of a batch comes from one weight version,
the one the rollout engine held when the batch started (whole groups, one version), and
step ``i + 1`` trains on responses one version old. Timeline of one step::

    main thread:  take batch i | launch i+1 | reward | advantage | update | wait | push
    worker:                      generate batch i+1 (weights of version i) ...|

The worker calls nothing but :meth:`~gepo_xtuner.rollout.RolloutBackend.generate`
(no collective, no tokenizer); requests are encoded and responses batched on the main
thread. A checkpoint saved at the end of step ``i`` holds batch ``i + 1`` (its samples:
token ids, logprobs, finish reasons, weight version), since the weights that produced it
are not in the checkpoint; a resumed run trains on exactly those responses.
"""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from mmengine.logging import print_log

from ...ops.distributed import dist_rank, dist_world_size
from ...rollout import RolloutRequest, SamplingParams
from ...rollout.base import RolloutBackend, RolloutSample
from ..state.run_state import gather_to_first

__all__ = ['PendingRollouts', 'RolloutAhead', 'ahead_seed', 'sampling_signature', 'stamp']


def stamp(samples: list[list[RolloutSample]], version: int) -> list[list[RolloutSample]]:
    """``samples`` with every response's ``weight_version`` set to ``version``."""
    for group in samples:
        for sample in group:
            sample.weight_version = version
    return samples


def sampling_signature(params: SamplingParams) -> dict[str, Any]:
    """What of ``params`` a batch generated ahead must share with the step that takes
    it (the per-step seed aside): K, the distribution and the length cap."""
    return dict(n=params.n, temperature=params.temperature, top_p=params.top_p,
                top_k=params.top_k, max_new_tokens=params.max_new_tokens,
                stop_token_ids=list(params.stop_token_ids))


def ahead_seed(seed: int | None, rank: int, step: int) -> int:
    """The private sampling seed of step ``step``'s batch on ``rank``: a pure function of
    the run's seed, so a resumed run samples what the straight one sampled."""
    return (((seed or 0) * 1_000_003 + step) * 10_007 + rank) % 2**63


@dataclass
class PendingRollouts:
    """One batch generated ahead.

    Attributes:
        step: the RL step (0-based) it is for.
        version: the weight version it was sampled with (updates the engine held).
        prompt_ids: the records' ``id`` fields, checked against the step's records.
        samples: ``samples[i][j]``, the j-th response to prompt i.
        seconds: wall time of the generation.
        sampling: :func:`sampling_signature` of the parameters it was sampled with
            (None in checkpoints written before it was recorded).
    """

    step: int
    version: int
    prompt_ids: list[Any]
    samples: list[list[RolloutSample]]
    seconds: float
    sampling: dict[str, Any] | None = field(default=None)

    def mismatch(self, step: int, prompt_ids: list[Any], params: SamplingParams) -> str | None:
        """Why this batch cannot be step ``step``'s (``prompt_ids``, ``params``), or None."""
        if self.step != step:
            return f'it was generated for step {self.step + 1}, not {step + 1}'
        if self.prompt_ids != list(prompt_ids):
            return (f'it answers prompts {self.prompt_ids[:4]}..., but this rank draws '
                    f'{list(prompt_ids)[:4]}... (a changed world size, batch size, dataset '
                    'or data order)')
        now = sampling_signature(params)
        if self.sampling is not None and self.sampling != now:
            return ', '.join(f'sampling.{k} was {old!r}, is {now[k]!r}'
                             for k, old in self.sampling.items() if old != now[k])
        return None

    def state_dict(self) -> dict[str, Any]:
        """Compact form for a checkpoint: token ids int32 and logprobs float32 tensors."""
        return dict(step=self.step, version=self.version, prompt_ids=list(self.prompt_ids),
                    seconds=self.seconds, sampling=self.sampling,
                    samples=[[(torch.tensor(s.response_ids, dtype=torch.int32),
                               torch.tensor(s.logprobs, dtype=torch.float32), s.finish_reason)
                              for s in group] for group in self.samples])

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> 'PendingRollouts':
        samples = [[RolloutSample(ids.tolist(), lps.tolist(), finish, state['version'])
                    for ids, lps, finish in group] for group in state['samples']]
        return cls(state['step'], state['version'], list(state['prompt_ids']), samples,
                   float(state['seconds']), state.get('sampling'))


class RolloutAhead:
    """Runs ``backend.generate`` for the next batch on a worker thread.

    One batch at a time: :meth:`launch` starts it, :meth:`wait` joins it (re-raising
    what the worker raised), :meth:`take` hands it to the step it was made for;
    :meth:`batch_for` is the RL loop's whole rollout stage with ``max_staleness = 1``.
    Every batch is sampled with its step's private seed (:meth:`params_for`).

    Args:
        backend: a rollout backend whose :meth:`overlap_refusal` is None, prepared
            with :meth:`prepare_overlap`.
        seed: returns the run's seed (:func:`ahead_seed`), read when a batch is
            sampled: mmengine's ``--resume`` may replace the seed after the loop is built.
    """

    def __init__(self, backend: RolloutBackend,
                 seed: Callable[[], int | None] = lambda: None) -> None:
        self.backend = backend
        self.seed = seed
        self.pending: PendingRollouts | None = None
        self._restored = False  # pending came from a checkpoint
        self._thread: threading.Thread | None = None
        self._job: dict[str, Any] = {}

    @property
    def running(self) -> bool:
        return self._thread is not None

    def params_for(self, params: SamplingParams, step: int) -> SamplingParams:
        """``params`` with step ``step``'s private seed on this rank."""
        return replace(params, seed=ahead_seed(self.seed(), dist_rank(), step))

    def batch_for(self, step: int, records: list[dict], requests: list[RolloutRequest],
                  params: SamplingParams,
                  next_step: Callable[[], tuple[list[dict], list[RolloutRequest]]] | None
                  ) -> tuple[list[list[RolloutSample]], int, float]:
        """Step ``step``'s responses, and the next step's generation started.

        The batch generated ahead for the step, or, at the first step and after a resume
        without a fitting one, a batch generated now on this thread with the current
        weights (version ``step``). Then, unless ``next_step`` is None (the last step),
        the records and requests it returns are generated on the worker thread.

        Returns:
            ``(samples, weight version, generation seconds)``; every sample carries the
            version.
        """
        pending, dropped = self.take(step, [r['id'] for r in records], params)
        if dropped:
            print_log(f'the batch generated ahead for step {step + 1}, restored from the '
                      f'checkpoint, is dropped and generated now: {dropped}', logger='current',
                      level=logging.WARNING)
        if pending is None:
            start = time.perf_counter()
            samples = self.backend.generate(requests, self.params_for(params, step))
            batch = stamp(samples, step), step, time.perf_counter() - start
        else:
            batch = pending.samples, pending.version, pending.seconds
        if next_step is not None:
            ahead, ahead_requests = next_step()
            self.launch(step + 1, step, [r['id'] for r in ahead], ahead_requests,
                        self.params_for(params, step + 1))
        return batch

    def launch(self, step: int, version: int, prompt_ids: list[Any],
               requests: list[RolloutRequest], params: SamplingParams) -> None:
        """Starts generating step ``step``'s batch with the engine's current weights."""
        if self._thread is not None or self.pending is not None:
            raise RuntimeError('RolloutAhead.launch: a batch is already ahead')
        job: dict[str, Any] = dict(step=step, version=version, prompt_ids=prompt_ids,
                                   sampling=sampling_signature(params))

        # the main thread's CUDA device (the current device is per thread; a rank's
        # worker must not launch on cuda:0)
        device = (torch.cuda.current_device()
                  if torch.cuda.is_available() and torch.cuda.is_initialized() else None)

        def work() -> None:
            if device is not None:
                torch.cuda.set_device(device)
            start = time.perf_counter()
            try:
                job['samples'] = self.backend.generate(requests, params)
            except BaseException as exc:  # noqa: BLE001 (re-raised on the main thread)
                job['error'] = exc
            job['seconds'] = time.perf_counter() - start

        self._job = job
        self._thread = threading.Thread(target=work, name=f'rollout-ahead-{step}', daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Joins the worker; its batch becomes :attr:`pending`.

        Raises:
            RuntimeError: the generation failed (the worker's exception is the cause).
        """
        if self._thread is None:
            return
        self._thread.join()
        self._thread, job = None, self._job
        if 'error' in job:
            raise RuntimeError(f'generating step {job["step"] + 1}\'s batch ahead failed: '
                               f'{job["error"]}') from job['error']
        stamp(job['samples'], job['version'])
        self.pending = PendingRollouts(job['step'], job['version'], job['prompt_ids'],
                                       job['samples'], job['seconds'], job['sampling'])

    def take(self, step: int, prompt_ids: list[Any], params: SamplingParams
             ) -> tuple[PendingRollouts | None, str | None]:
        """The batch made ahead for ``step`` (after :meth:`wait`), or None.

        A batch restored from a checkpoint that does not fit the step (written under
        another world size, batch size, dataset or sampling) is dropped: the step's
        responses are then generated now, and the reason is returned for the log.

        Returns:
            ``(batch or None, why a restored batch was dropped or None)``.

        Raises:
            RuntimeError: a batch generated in this run does not fit the step it was
                launched for (the loop drew other records than it peeked: a bug).
        """
        self.wait()
        pending, self.pending, restored = self.pending, None, self._restored
        self._restored = False
        if pending is None:
            return None, None
        reason = pending.mismatch(step, prompt_ids, params)
        if reason and not restored:
            raise RuntimeError(f'the batch generated ahead does not fit step {step + 1}: '
                               f'{reason}')
        return (None, reason) if reason else (pending, None)

    def discard(self) -> None:
        """Cancels (:meth:`RolloutBackend.abort`) and joins a running worker and drops its
        batch and any error (the step that would take it failed): no generation is left
        running behind an exception."""
        if self._thread is not None:
            abort = getattr(self.backend, 'abort', None)  # RolloutBackend's; duck types too
            if self._thread.is_alive() and abort is not None:
                abort()
            self._thread.join()
        self._thread, self._job, self.pending, self._restored = None, {}, None, False

    def state_dict(self) -> dict[str, Any] | None:
        """The pending batch (the worker is joined first), or None."""
        self.wait()
        return None if self.pending is None else self.pending.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.pending = None if state is None else PendingRollouts.from_state(state)
        self._restored = state is not None

    # -- in the RL loop's run state (``ranks[r]['rollout_ahead']``) ------------------------
    def gather(self, ranks: list[dict[str, Any]]) -> None:
        """Puts every rank's batch into ``ranks`` (every rank's run state) on rank 0.

        A collective (see ``RLTrainLoop.prepare_checkpoint``)."""
        for entry, batch in zip(ranks, gather_to_first(self.state_dict()) or ()):
            entry['rollout_ahead'] = batch

    def complete(self, ranks: list[dict[str, Any]]) -> None:
        """For a checkpoint saved without :meth:`gather`: this process's own batch at
        least, and a warning naming the ranks whose batch is not in it."""
        if all('rollout_ahead' in entry for entry in ranks):
            return
        if dist_rank() < len(ranks):
            ranks[dist_rank()]['rollout_ahead'] = self.state_dict()
        missing = [r for r, e in enumerate(ranks) if 'rollout_ahead' not in e]
        if missing:
            print_log(f'this checkpoint lacks the batches generated ahead of ranks {missing} '
                      "(saved off the CheckpointHook's schedule; a hook that saves should call "
                      'train_loop.prepare_checkpoint() on every rank first)', logger='current',
                      level=logging.WARNING)

    def restore(self, state: dict[str, Any], entry: dict[str, Any] | None) -> None:
        """Takes this rank's batch from its saved ``entry`` of the run ``state``; names the
        ranks without one (every rank reads the list, so rank 0, whose log is shown,
        speaks for all)."""
        if entry is not None:
            self.load_state_dict(entry.get('rollout_ahead'))
        missing = [r for r, e in enumerate(state.get('ranks', []))
                   if e.get('rollout_ahead') is None and r < dist_world_size()]
        if missing and state.get('settings', {}).get('max_staleness'):
            print_log(f'the checkpoint holds no batch generated ahead for ranks {missing}: '
                      "their next responses are generated now with the checkpoint's weights "
                      '(the uninterrupted run sampled them one version earlier)',
                      logger='current', level=logging.WARNING)
