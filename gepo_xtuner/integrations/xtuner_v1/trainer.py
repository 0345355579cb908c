"""The smallest extension of XTuner v1's RL trainers that GEPO needs.

v1's ``BaseRLTrainer`` calls the advantage estimator once per prompt group inside
``_prepare_train_data`` and checkpoints only ``train_state.json`` besides model,
optimizer and sampler state. :class:`StepAdvantageTrainerMixin` overrides three of
its methods, each calling v1's own first or around it:

* ``_prepare_train_data`` (once per training step, in the single trainer driver):
  ``begin_step`` of a :class:`StepAdvantageEstimator` with every group v1 will
  train on, then v1's method unchanged (its per-group ``compute`` calls), then
  ``end_step``; the estimator's metrics join v1's ``data_info`` (logged as
  ``response/gepo/...``).
* ``_maybe_save_checkpoint``: after v1 has saved ``ckpt-step-N/``, writes the
  estimator's state there as ``<estimator.state_filename>``.
* ``_resume_train_controller_and_state`` (v1's resume path for ``load_checkpoint_cfg``
  and ``auto_resume``, colocated and disaggregated): after v1's, reads it back.

Estimators without the step contract (v1's GRPO, RLOO, ...) pass through unchanged.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from xtuner.v1.train.rl_trainer import (
    RLColocateTrainer,
    RLColocateTrainerConfig,
    RLDisaggregatedTrainer,
    RLDisaggregatedTrainerConfig,
    is_valid_for_training,
)

from ...atomic_io import atomic_write_json
from .estimator import StepAdvantageEstimator

__all__ = ['StepAdvantageTrainerMixin', 'GEPORLColocateTrainer', 'GEPORLDisaggregatedTrainer',
           'GEPORLColocateTrainerConfig', 'GEPORLDisaggregatedTrainerConfig',
           'save_estimator_state', 'load_estimator_state']

# v1 logs its own warning when it skips an invalid group; the batch pass asks the same
# question first and must not log it twice.
_QUIET = logging.getLogger('gepo_xtuner.xtuner_v1.group_check')
_QUIET.disabled = True


def save_estimator_state(estimator: Any, checkpoint_dir: Path) -> Path | None:
    """Writes a stateful estimator's state into a checkpoint directory.

    The file is written next to it and renamed into place, so a checkpoint never
    holds a partial state file.

    Returns:
        The file written, or None for an estimator without state.
    """
    if not isinstance(estimator, StepAdvantageEstimator) or estimator.state_filename is None:
        return None
    state = estimator.state_dict()
    if state is None:
        return None
    return atomic_write_json(Path(checkpoint_dir) / estimator.state_filename, state, indent=2)


def load_estimator_state(estimator: Any, checkpoint_dir: Path, logger: Any) -> bool:
    """Restores a stateful estimator from a checkpoint directory.

    A checkpoint without the file (saved by v1's own trainer, or by a run with another
    estimator) is resumed with a fresh state and a warning, as mmengine's hooks do.

    Returns:
        Whether a state was restored.
    """
    if not isinstance(estimator, StepAdvantageEstimator) or estimator.state_filename is None:
        return False
    path = Path(checkpoint_dir) / estimator.state_filename
    if not path.is_file():
        logger.warning(f'{path} not found: {type(estimator).__name__} starts from a fresh state '
                       '(the checkpoint was saved without it)')
        return False
    # Python's json writes floats with repr and reads them back exactly.
    estimator.load_state_dict(json.loads(path.read_text(encoding='utf-8')))
    logger.info(f'Restored {type(estimator).__name__} state from {path}')
    return True


class StepAdvantageTrainerMixin:
    """Gives a v1 RL trainer a per-step pass of its estimator and checkpoints its state.

    Put it before a v1 trainer class: ``class T(StepAdvantageTrainerMixin, RLColocateTrainer)``.
    """

    def _prepare_train_data(self, data_groups: list[list[Any]], pack_max_length: int,
                            raw_rewards_sum: float = 0.0, raw_rewards_count: int = 0):
        estimator = self._advantage_estimator
        if not isinstance(estimator, StepAdvantageEstimator):
            return super()._prepare_train_data(data_groups, pack_max_length,
                                               raw_rewards_sum=raw_rewards_sum,
                                               raw_rewards_count=raw_rewards_count)
        # Exactly the groups v1 will train on: it skips the others before computing advantages.
        metrics = estimator.begin_step([g for g in data_groups if is_valid_for_training(g, _QUIET)])
        try:
            data_batches, data_info = super()._prepare_train_data(
                data_groups, pack_max_length, raw_rewards_sum=raw_rewards_sum,
                raw_rewards_count=raw_rewards_count)
        finally:
            estimator.end_step()
        data_info.update(metrics)
        return data_batches, data_info

    async def _maybe_save_checkpoint(self, cur_step: int) -> None:
        checkpoints = self._meta.latest_exp.checkpoint_list
        last_before = checkpoints[-1] if checkpoints else None
        await super()._maybe_save_checkpoint(cur_step)
        checkpoints = self._meta.latest_exp.checkpoint_list
        if checkpoints and checkpoints[-1] != last_before:  # v1 saved this step
            path = save_estimator_state(self._advantage_estimator, Path(checkpoints[-1]))
            if path is not None:
                self.logger.info(f'Saved {type(self._advantage_estimator).__name__} state to {path}')

    def _resume_train_controller_and_state(self, checkpoint_path: Path | str) -> Path:
        path = super()._resume_train_controller_and_state(checkpoint_path)
        load_estimator_state(self._advantage_estimator, Path(path), self.logger)
        return path


class GEPORLColocateTrainer(StepAdvantageTrainerMixin, RLColocateTrainer):
    """v1's colocated RL trainer with the step pass (:class:`StepAdvantageTrainerMixin`)."""


class GEPORLDisaggregatedTrainer(StepAdvantageTrainerMixin, RLDisaggregatedTrainer):
    """v1's disaggregated RL trainer with the step pass (:class:`StepAdvantageTrainerMixin`)."""


class GEPORLColocateTrainerConfig(RLColocateTrainerConfig):
    """``RLColocateTrainerConfig`` whose ``build()`` gives a :class:`GEPORLColocateTrainer`.

    Same fields; use it with ``advantage_estimator_config=GEPOAdvantageConfig(...)``. With
    any other estimator config it trains exactly as ``RLColocateTrainerConfig``.
    """

    def build(self) -> GEPORLColocateTrainer:
        return GEPORLColocateTrainer(self)


class GEPORLDisaggregatedTrainerConfig(RLDisaggregatedTrainerConfig):
    """``RLDisaggregatedTrainerConfig`` whose ``build()`` gives a :class:`GEPORLDisaggregatedTrainer`."""

    def build(self) -> GEPORLDisaggregatedTrainer:
        return GEPORLDisaggregatedTrainer(self)
