"""The RL loop's settings that need no model, runner or data, built and checked once.

:class:`~gepo_xtuner.engine.loop.RLTrainLoop` builds them first thing, and
``tools/check_config.py`` builds the same object from the same ``train_cfg``, so a value
the loop refuses when it is built is refused by the check too, with the same message.
"""

import inspect
from dataclasses import dataclass
from typing import Any

from ..rollout import SamplingParams
from .overlap import check_overlap_settings
from .update import (UpdateSettings, behaviour_refusal, check_training_sampling,
                     resolve_behaviour_correction)


@dataclass(frozen=True)
class LoopSettings:
    """``train_cfg``'s step settings, checked (fields as in ``RLTrainLoop``'s arguments).

    Attributes:
        max_steps: RL steps to run (>= 1).
        num_responses: K, responses per prompt (>= 1).
        max_staleness: 0 or 1 (:func:`~gepo_xtuner.engine.overlap.check_overlap_settings`).
        entropy_logprobs: ``'proximal'`` or ``'behaviour'``.
        behaviour_correction: resolved: ``'auto'`` is ``'truncate'`` with
            ``max_staleness`` 1, else ``'none'``.
        sampling: the sampling parameters without stop ids (the loop adds the
            tokenizer's EOS when it starts), accepted by
            :func:`~gepo_xtuner.engine.update.check_training_sampling`.
        update: the trainer side's :class:`~gepo_xtuner.engine.update.UpdateSettings`
            (temperature and length cap completed when the loop starts).
    """

    max_steps: int
    num_responses: int
    max_staleness: int
    entropy_logprobs: str
    behaviour_correction: str
    sampling: SamplingParams
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
        check_overlap_settings(max_staleness, entropy_logprobs)
        correction = resolve_behaviour_correction(behaviour_correction, max_staleness)
        update = UpdateSettings(
            minibatch_responses_per_rank, ppo_epochs, max_tokens_per_micro_batch,
            logprob_max_tokens_per_micro_batch, kept_rows, norm_length=norm_length,
            behaviour_correction=correction, behaviour_cap=behaviour_cap)
        params = SamplingParams(**{**dict(sampling or {}), 'n': num_responses,
                                   'stop_token_ids': ()})
        check_training_sampling(params)
        return cls(max_steps, num_responses, max_staleness, entropy_logprobs, correction,
                   params, update)

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
        refusal = rollout.overlap_refusal() if self.max_staleness else None
        if refusal is not None:
            raise ValueError(f'train_cfg.max_staleness >= 1 needs a rollout backend that can '
                             f'generate while the trainer updates: {refusal}')
        temperature = rollout.logprob_temperature(self.sampling)
        refusal = behaviour_refusal(temperature, self.sampling, self.behaviour_correction,
                                    self.entropy_logprobs)
        if refusal is not None:
            raise ValueError(refusal)
        return temperature
