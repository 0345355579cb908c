"""The RL loop's rollout stage: where each step's responses come from, in turn or ahead.

The loop asks one object for a step's records and responses, tells it when weights
are about to be pushed, and lets it keep its share of the run state; it never asks
which kind it holds. Three kinds, picked by ``train_cfg.max_staleness``:

- :class:`RolloutStage` (0): draw the step's records, generate their responses with the
  weights of the last push (version = the step), then train; nothing is in flight
  between steps and nothing of it is in a checkpoint.
- :class:`RolloutStageAhead` (1): the step takes the batch generated while the previous
  step trained (version = the step - 1) and starts the next one on a worker thread
  (:class:`~gepo_xtuner.engine.step.overlap.RolloutAhead`); it waits for that worker before a
  push, and a checkpoint holds the batch in flight as samples.
- :class:`~gepo_xtuner.engine.step.stream.RolloutStageStream` (``k >= 2``): a producer
  thread generates groups continuously, at most ``k`` batches ahead, each group with the
  weights the backend holds when it starts (staleness ``<= k``); it pauses at a group
  boundary for each push, and a checkpoint holds its complete groups as samples.

Call order, per step: :meth:`~RolloutStage.next_records`, :meth:`~RolloutStage.responses`,
(score, advantage, update), :meth:`~RolloutStage.before_sync`, push,
:meth:`~RolloutStage.step_metrics`, :meth:`~RolloutStage.end_step`; then
:meth:`~RolloutStage.finish` when the run ends, or :meth:`~RolloutStage.discard` when a
step fails.
"""

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from ...rollout import RolloutRequest, SamplingParams
from ...rollout.base import RolloutBackend, RolloutSample
from .batching import Rollouts
from .overlap import RolloutAhead, stamp
from .stream import RolloutStageStream
from ..runtime.mmengine_private import checkpoint_due

if TYPE_CHECKING:
    from ..train_cfg import StageSettings

__all__ = ['RolloutStage', 'RolloutStageAhead', 'RolloutStageStream', 'build_rollout_stage']

Samples = list[list[RolloutSample]]


class RolloutStage:
    """Generation in turn with the update (``max_staleness = 0``).

    Args:
        backend: the rollout backend (attached to the policy before the first step).
        source: the step records, one list of B prompt records per step (the loop's
            infinite dataloader iterator).
        encode: records -> rollout requests (main thread only: tokenizer, processor).
    """

    max_staleness = 0

    def __init__(self, backend: RolloutBackend, source: Iterator[list[dict]],
                 encode: Callable[[list[dict]], list[RolloutRequest]]) -> None:
        self.backend = backend
        self.source = source
        self.encode = encode

    def start(self) -> None:
        """Called once before the first step, after the backend is attached."""

    def next_records(self) -> list[dict]:
        """The records of the next step."""
        return next(self.source)

    def responses(self, step: int, records: list[dict], requests: list[RolloutRequest],
                  params: SamplingParams, last: bool) -> tuple[Samples, int, float | None]:
        """Step ``step``'s K responses to each of ``records`` (encoded as ``requests``).

        Args:
            step: the RL step, 0-based.
            last: no step follows this one.

        Returns:
            ``(samples, weight version, generation seconds or None)``: ``samples[b][k]``
            the k-th response to ``records[b]``, each stamped with the weight version
            (the number of updates the engine held when it was sampled); None seconds:
            generated inside the step's rollout stage (its clock times it).
        """
        samples = self.backend.generate(requests, params)
        return stamp(samples, step), step, None

    def before_sync(self, clock: Callable[[str], AbstractContextManager]) -> None:
        """Before the new weights are pushed: nothing may be generating then."""

    def discard(self) -> None:
        """The step failed: leaves nothing running behind the error."""

    def finish(self) -> None:
        """The run ended (its last step, or a hook's ``stop_training``): leaves nothing
        running."""

    def step_metrics(self, step: int, rollouts: Rollouts, seconds: float) -> dict[str, float]:
        """Generation metrics of step ``step``: ``perf/gen_tokens`` (response tokens of
        ``rollouts``) and ``perf/gen_tokens_per_sec`` over the generation's wall time
        (``rollouts.seconds`` when it ran apart from the step, else the step's rollout
        stage, ``seconds``)."""
        new_tokens = int(rollouts.batch.response_mask.sum())
        generation = seconds if rollouts.seconds is None else rollouts.seconds
        return {'perf/gen_tokens': float(new_tokens),
                'perf/gen_tokens_per_sec': new_tokens / max(generation, 1e-9)}

    # -- its share of the loop's run state -------------------------------------------------
    def end_step(self, runner: Any, max_steps: int, ranks: list[dict[str, Any]]) -> None:
        """After the step's ``ranks`` (every rank's run state) were gathered; a collective
        (every rank calls it)."""

    def gather(self, ranks: list[dict[str, Any]]) -> None:
        """Puts every rank's share into ``ranks`` for a checkpoint; a collective."""

    def complete(self, ranks: list[dict[str, Any]]) -> None:
        """Fills in what :meth:`gather` did not, for a checkpoint saved now (rank 0)."""

    def restore(self, state: dict[str, Any], entry: dict[str, Any] | None) -> None:
        """Takes its share from a checkpoint's run ``state`` (this rank's ``entry``)."""


class RolloutStageAhead(RolloutStage):
    """Generation one batch ahead of the update (``max_staleness = 1``): see
    :mod:`~gepo_xtuner.engine.step.overlap`.

    Args:
        backend, source, encode: as :class:`RolloutStage`; ``backend`` must be able to
            overlap (its ``overlap_refusal()`` is None; checked by ``TrainCfg.check_backend``).
        seed: returns the run's seed, read when a batch is sampled (``--resume`` may
            replace it after the loop is built).
    """

    max_staleness = 1

    def __init__(self, backend: RolloutBackend, source: Iterator[list[dict]],
                 encode: Callable[[list[dict]], list[RolloutRequest]],
                 seed: Callable[[], int | None]) -> None:
        super().__init__(backend, source, encode)
        self.ahead = RolloutAhead(backend, seed)
        self._peeked: list[dict] | None = None  # the next step's records, drawn early

    def start(self) -> None:
        self.backend.prepare_overlap()  # e.g. its own copy of the weights

    def next_records(self) -> list[dict]:
        records, self._peeked = self._peeked, None
        return records if records is not None else next(self.source)

    def _peek(self) -> tuple[list[dict], list[RolloutRequest]]:
        """The records of the step after this one (not consumed) and their requests."""
        if self._peeked is None:
            self._peeked = next(self.source)
        return self._peeked, self.encode(self._peeked)

    def responses(self, step: int, records: list[dict], requests: list[RolloutRequest],
                  params: SamplingParams, last: bool) -> tuple[Samples, int, float | None]:
        """The batch generated ahead for ``step`` (at the first step, or after a resume
        without one, generated now with the current weights), and the next step's
        generation started unless ``last``."""
        return self.ahead.batch_for(step, records, requests, params,
                                    None if last else self._peek)

    def before_sync(self, clock: Callable[[str], AbstractContextManager]) -> None:
        with clock('rollout_ahead_wait'):  # no request in flight during the push
            self.ahead.wait()

    def discard(self) -> None:
        self.ahead.discard()

    def step_metrics(self, step: int, rollouts: Rollouts, seconds: float) -> dict[str, float]:
        """Also ``rollout/staleness`` (one version per batch: the mean is the max) and the
        generation's own wall time, ``time/rollout_generate``."""
        metrics = super().step_metrics(step, rollouts, seconds)
        staleness = float(step - rollouts.version)
        generation = seconds if rollouts.seconds is None else rollouts.seconds
        return {**metrics, 'rollout/staleness': staleness, 'rollout/staleness_max': staleness,
                'time/rollout_generate': generation}

    def end_step(self, runner: Any, max_steps: int, ranks: list[dict[str, Any]]) -> None:
        """Gathers the batch ahead at the steps the runner's ``CheckpointHook`` saves at
        (a step's whole set of responses: not gathered every step)."""
        if checkpoint_due(runner, max_steps):
            self.gather(ranks)

    def gather(self, ranks: list[dict[str, Any]]) -> None:
        self.ahead.gather(ranks)

    def complete(self, ranks: list[dict[str, Any]]) -> None:
        self.ahead.complete(ranks)

    def restore(self, state: dict[str, Any], entry: dict[str, Any] | None) -> None:
        self.ahead.restore(state, entry)


def build_rollout_stage(settings: 'StageSettings', backend: RolloutBackend,
                        source: Iterator[list[dict]],
                        encode: Callable[[list[dict]], list[RolloutRequest]],
                        seed: Callable[[], int | None], max_steps: int | None = None
                        ) -> 'RolloutStage | RolloutStageStream':
    """The stage for ``settings``, the run's checked
    :class:`~gepo_xtuner.engine.train_cfg.StageSettings`: ``max_staleness`` 0 in turn, 1
    one batch ahead, ``k >= 2`` streaming (which needs ``max_steps``, the run's steps:
    nothing at or past it is drawn or generated)."""
    if settings.max_staleness >= 2:
        if max_steps is None:
            raise ValueError('build_rollout_stage: max_staleness >= 2 needs max_steps')
        return RolloutStageStream(backend, source, encode, seed, settings.max_staleness,
                                  max_steps, partial=settings.partial_rollout,
                                  workers=settings.groups_in_flight)
    if settings.max_staleness:
        return RolloutStageAhead(backend, source, encode, seed)
    return RolloutStage(backend, source, encode)
