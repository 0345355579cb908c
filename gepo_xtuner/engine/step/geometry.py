"""The batch arithmetic of one RL step, checked when the loop is built.

:class:`~gepo_xtuner.engine.loop.RLTrainLoop` builds a :class:`StepGeometry` from its
arguments and the world size, so a batch that cannot be split fails before any model
loads; ``tools/check_config.py`` builds the same object with the world size it is told
and prints its rows and warnings.
"""

import logging
import math
from dataclasses import dataclass
from typing import Any

from mmengine.logging import print_log


def check_group_size(processor: Any, num_responses: int) -> None:
    """Refuses fewer responses per prompt than the processor can learn from.

    Raises:
        ValueError: ``num_responses < processor.min_group_size``.
    """
    need = getattr(processor, 'min_group_size', 1)
    if isinstance(num_responses, int) and num_responses < need:
        raise ValueError(
            f'train_cfg.num_responses is {num_responses}, but {type(processor).__name__} '
            'compares each response with the others of its group: with fewer than '
            f'{need} every advantage is 0 and nothing is learned; set num_responses >= {need} '
            '(the paper uses 16)')


@dataclass(frozen=True)
class StepGeometry:
    """Prompts, responses and optimizer steps of one RL step.

    Args:
        prompts_per_rank: B, ``train_dataloader.batch_size``.
        num_responses: K, responses per prompt.
        minibatch_responses_per_rank: responses per optimizer step and rank.
        ppo_epochs: passes over each rollout batch.
        world_size: P, training processes.
        prompts_per_step: the intended prompts per RL step over all ranks
            (``train_cfg.prompts_per_step``), or None: not checked.
        minibatch_responses: the intended responses per optimizer step over all ranks
            (``train_cfg.minibatch_responses``), or None: not checked.

    Raises:
        ValueError: a size that is not an integer >= 1, or a world size that does not
            split the intended global sizes evenly (the message says what to change).
    """

    prompts_per_rank: int
    num_responses: int
    minibatch_responses_per_rank: int
    ppo_epochs: int = 1
    world_size: int = 1
    prompts_per_step: int | None = None
    minibatch_responses: int | None = None

    def __post_init__(self) -> None:
        sizes = dict(train_dataloader_batch_size=self.prompts_per_rank,
                     num_responses=self.num_responses,
                     minibatch_responses_per_rank=self.minibatch_responses_per_rank,
                     ppo_epochs=self.ppo_epochs, world_size=self.world_size)
        bad = {k: v for k, v in sizes.items()
               if isinstance(v, bool) or not isinstance(v, int) or v < 1}
        if bad:
            raise ValueError(f'train_cfg: {bad} must be integers >= 1')
        w = self.world_size
        for name, target, per_rank, key in (
                ('prompts per RL step', self.prompts_per_step, self.prompts_per_rank,
                 'train_dataloader.batch_size'),
                ('responses per optimizer step', self.minibatch_responses,
                 self.minibatch_responses_per_rank, 'train_cfg.minibatch_responses_per_rank')):
            if target is not None and per_rank * w != target:
                raise ValueError(
                    f'{w} training processes cannot split the batch evenly: {name} should be '
                    f'{target} over all ranks, but {key}={per_rank} per rank gives '
                    f'{per_rank * w}; use a number of processes that divides {target} '
                    '(1, 2, 4, 8, ...)')

    @property
    def responses_per_rank(self) -> int:
        return self.prompts_per_rank * self.num_responses

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps per RL step: ``ceil(B*K / minibatch_responses_per_rank) * ppo_epochs``;
        fewer on steps where the advantage processor removes rows (AEPO's gate, see
        ``train_cfg.kept_rows``)."""
        steps = math.ceil(self.responses_per_rank / self.minibatch_responses_per_rank)
        return steps * self.ppo_epochs

    def warnings(self) -> list[str]:
        """Settings that work but probably are not what was meant."""
        out = []
        n, m = self.responses_per_rank, self.minibatch_responses_per_rank
        if m > n:
            out.append(f'train_cfg.minibatch_responses_per_rank ({m}) is larger than the '
                       f'{self.prompts_per_rank} x {self.num_responses} = {n} responses of an RL '
                       'step on this rank: every step takes ONE optimizer step over all of '
                       'them; lower minibatch_responses_per_rank for several')
        elif n % m:
            out.append(f'train_cfg.minibatch_responses_per_rank: {n} responses per rank do not '
                       f'split into minibatches of {m}; they are split into equal parts instead')
        return out

    def rows(self, world_source: str = '') -> dict[str, str]:
        """Report lines, name -> value."""
        w, k, m = self.world_size, self.num_responses, self.minibatch_responses_per_rank
        source = f' ({world_source})' if world_source else ''
        return {
            'world size': f'{w}{source}',
            'prompts per RL step': f'{self.prompts_per_rank} per rank x {w} = '
                                   f'{self.prompts_per_rank * w}',
            'responses per RL step': f'{self.responses_per_rank} per rank x {w} = '
                                     f'{self.responses_per_rank * w}',
            'minibatch': f'{m} responses per rank x {w} = {m * w} responses '
                         f'(= {m * w / k:g} prompts)',
            'optimizer steps per RL step': f'{self.optimizer_steps} (ppo_epochs {self.ppo_epochs})',
        }


def warn_step_geometry(prompts_per_rank: Any, num_responses: int,
                       minibatch_responses_per_rank: int, ppo_epochs: int, world_size: int,
                       prompts_per_step: int | None, minibatch_responses: int | None) -> None:
    """Builds the :class:`StepGeometry` (refusing what it refuses) and logs its
    :meth:`~StepGeometry.warnings`; nothing when ``prompts_per_rank`` is None (a custom
    batch sampler: batch sizes vary)."""
    if not isinstance(prompts_per_rank, int):
        return
    geometry = StepGeometry(prompts_per_rank, num_responses, minibatch_responses_per_rank,
                            ppo_epochs, world_size, prompts_per_step, minibatch_responses)
    for warning in geometry.warnings():
        print_log(warning, logger='current', level=logging.WARNING)
