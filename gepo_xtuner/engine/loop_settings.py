"""The RL loop's settings that need no model, runner or data, built and checked once.

:class:`~gepo_xtuner.engine.loop.RLTrainLoop` builds them first thing, and
``tools/check_config.py`` builds the same object from the same ``train_cfg``, so a value
the loop refuses when it is built is refused by the check too, with the same message.
"""

import inspect
from dataclasses import dataclass, replace
from typing import Any

from ..rollout import SamplingParams
from .step.update import (UpdateSettings, behaviour_refusal, check_training_sampling,
                          resolve_behaviour_correction)


@dataclass(frozen=True)
class LoopSettings:
    """``train_cfg``'s step settings, checked (fields as in ``RLTrainLoop``'s arguments).

    Attributes:
        max_steps: RL steps to run (>= 1).
        num_responses: K, responses per prompt (>= 1).
        max_staleness: 0: generate, then train, strictly in turn. 1: generate the next
            step's responses on a worker thread while this step is scored and trained
            (:mod:`~gepo_xtuner.engine.step.rollout_stage`); each batch is then one weight
            version old (``rollout/staleness``). Needs a backend that can overlap (not
            LMDeploy's colocated sleep/wake mode).
        entropy_logprobs: which sampled-token logprobs the advantage processor gets
            (``AdvantageInputs.logprobs``: GEPO's group entropy, the group's mean
            negative logprob, and so its band): ``'proximal'`` (the recomputed old
            logprobs, the policy being shaped) or ``'behaviour'`` (the rollout engine's,
            the policy that sampled). The full-vocabulary entropies
            (``AdvantageInputs.entropies``, e.g. AEPO's) are always the proximal
            policy's: the engine reports none. The same with ``max_staleness = 0`` up to
            the engine/trainer mismatch; see ``docs/training.md``.
        behaviour_correction: the importance weight ``w`` between the recomputed
            (proximal) old policy and the policy that sampled (behaviour): ``'none'``,
            ``'truncate'`` (``min(w, behaviour_cap)``) or ``'mask'`` (tokens with ``w``
            outside ``[1/cap, cap]`` leave the loss); resolved: ``'auto'`` is
            ``'truncate'`` with ``max_staleness`` 1, else ``'none'`` (weight exactly 1).
            Needs the rollout's logprobs at the sampling temperature
            (:func:`~gepo_xtuner.engine.step.update.behaviour_refusal`).
        sampling: the sampling parameters without stop ids, accepted by
            :func:`~gepo_xtuner.engine.step.update.check_training_sampling`.
        stop_token_ids: the configured stop ids; None: the tokenizer's EOS
            (:meth:`sampling_for`).
        update: the trainer side's :class:`~gepo_xtuner.engine.step.update.UpdateSettings`
            (temperature and length cap completed by :meth:`update_for`).
    """

    max_steps: int
    num_responses: int
    max_staleness: int
    entropy_logprobs: str
    behaviour_correction: str
    sampling: SamplingParams
    stop_token_ids: tuple[int, ...] | None
    update: UpdateSettings

    @classmethod
    def build(cls, max_steps: int, num_responses: int, sampling: dict | None,
              minibatch_responses_per_rank: int, ppo_epochs: int,
              max_tokens_per_micro_batch: int | None,
              logprob_max_tokens_per_micro_batch: int | None, kept_rows: str,
              norm_length: int | None, max_staleness: int, behaviour_correction: str,
              behaviour_cap: float, entropy_logprobs: str) -> 'LoopSettings':
        """Checks and builds the settings (arguments as ``train_cfg`` names them).

        Raises:
            ValueError: a value the loop does not take, naming the key.
            TypeError: a sampling field :class:`~gepo_xtuner.rollout.SamplingParams`
                does not have.
        """
        if min(max_steps, num_responses) < 1:
            raise ValueError('RLTrainLoop needs max_steps and num_responses >= 1, got '
                             f'{max_steps}, {num_responses}')
        if max_staleness not in (0, 1):
            raise ValueError(
                f'train_cfg.max_staleness must be 0 (generate, then train) or 1 (generate the '
                f'next batch while this one trains), got {max_staleness!r}: the loop runs '
                'generation at most one batch ahead, since it pushes weights only between '
                'generations')
        if entropy_logprobs not in ('proximal', 'behaviour'):
            raise ValueError("train_cfg.entropy_logprobs must be 'proximal' or 'behaviour', "
                             f'got {entropy_logprobs!r}')
        correction = resolve_behaviour_correction(behaviour_correction, max_staleness)
        update = UpdateSettings(
            minibatch_responses_per_rank, ppo_epochs, max_tokens_per_micro_batch,
            logprob_max_tokens_per_micro_batch, kept_rows, norm_length=norm_length,
            behaviour_correction=correction, behaviour_cap=behaviour_cap)
        params = SamplingParams(**{**dict(sampling or {}), 'n': num_responses,
                                   'stop_token_ids': ()})
        check_training_sampling(params)
        stop = (sampling or {}).get('stop_token_ids')
        return cls(max_steps, num_responses, max_staleness, entropy_logprobs, correction,
                   params, None if stop is None else tuple(stop), update)

    def sampling_for(self, eos_token_id: int) -> SamplingParams:
        """The sampling parameters of the run: the configured stop ids, else the
        tokenizer's ``eos_token_id``."""
        stop = self.stop_token_ids if self.stop_token_ids is not None else (eos_token_id, )
        return replace(self.sampling, stop_token_ids=stop)

    def update_for(self, sampling: SamplingParams) -> UpdateSettings:
        """The update's settings for ``sampling``: the trainer scores responses under its
        temperature, and the loss's constant length defaults to its generation cap."""
        return replace(self.update, temperature=sampling.temperature,
                       norm_length=self.update.norm_length or sampling.max_new_tokens)

    @classmethod
    def from_train_cfg(cls, train_cfg: dict[str, Any]) -> 'LoopSettings':
        """:meth:`build` from a whole ``train_cfg`` (the loop's defaults for keys it
        omits; keys the settings do not read are ignored)."""
        from .loop import RLTrainLoop
        values = {**RLTrainLoop.defaults(), **train_cfg}
        names = list(inspect.signature(cls.build).parameters)
        missing = [n for n in names if n not in values]
        if missing:
            raise ValueError(f'train_cfg needs {", ".join(missing)}')
        return cls.build(**{n: values[n] for n in names})

    def check_backend(self, rollout: Any) -> float:
        """The refusals that need the built rollout backend: generation ahead it cannot
        do, logprobs at a temperature an off-policy correction cannot use.

        Returns:
            The temperature of the backend's logprobs for these sampling settings.

        Raises:
            ValueError: saying why and what to change.
        """
        if self.max_staleness:
            rollout.check_overlap()
        temperature = rollout.logprob_temperature(self.sampling)
        refusal = behaviour_refusal(temperature, self.sampling, self.behaviour_correction,
                                    self.entropy_logprobs)
        if refusal is not None:
            raise ValueError(refusal)
        return temperature
