"""Compact progress lines for RL runs (every metric still goes to the scalar backends), and
the clock of a step's stages."""

import time
from collections.abc import Iterator
from contextlib import contextmanager

from mmengine.registry import LOG_PROCESSORS, VISBACKENDS
from mmengine.runner import LogProcessor
from mmengine.visualization import TensorboardVisBackend

from ...advantage.base import BAND_KEYS

#: The console line: ``(label, metrics)``, shown when the step has all the metrics; two
#: metrics print as ``a/b``. Shaping shares are of the step's responses.
SUMMARY = (('reward', ('reward/mean',)), ('val', ('val/acc',)),
           ('H_nll', ('entropy/group_nll_mean',)), ('band', BAND_KEYS),
           ('damped+/-', ('shaping/frac_damped_pos', 'shaping/frac_damped_neg')),
           ('pg', ('loss/pg',)), ('grad_norm', ('optim/grad_norm',)),
           ('stale', ('rollout/staleness',)), ('s/step', ('time/step',)))
#: What mmengine's own hooks record at every iteration (kept in every step's scalars).
#: Not its ``grad_norm``: that is the last minibatch's, the loop logs ``optim/grad_norm``.
PER_ITER_KEYS = ('lr', 'time', 'data_time')


@LOG_PROCESSORS.register_module()
class RLLogProcessor(LogProcessor):
    """Prints a short step line; the scalar backends receive every metric.

    With dozens of per-domain metrics per step, mmengine's default line is
    unreadable. The printed line is the step counter, ETA, learning rate and the
    ``summary`` metrics the step has (about 150 characters), e.g.
    ``Iter(train) [5/8]  eta 1m06s  lr 1e-04  reward 0.273  H_nll 0.558  band
    0.255/0.432  damped+/- 0.0312/0.141  pg 0.00894  grad_norm 1.26  s/step 9.29``.

    The tag (what visualizer backends and ``scalars.json`` get) holds only what
    was measured at this step: the RL loop's metrics of the step
    (``RLTrainLoop.step_metrics``) and mmengine's per-iteration values. mmengine's
    message hub keeps every key it has seen, so without this a step without
    validation (or without a domain in its batch) would repeat the last value.

    Args:
        summary: ``(label, metrics)`` pairs to print.
        **kwargs: :class:`mmengine.runner.LogProcessor` arguments.
    """

    def __init__(self, summary: tuple[tuple[str, tuple[str, ...]], ...] = SUMMARY,
                 **kwargs) -> None:
        kwargs.setdefault('by_epoch', False)
        kwargs.setdefault('window_size', 1)
        super().__init__(**kwargs)
        self.summary = tuple(summary)

    def get_log_after_iter(self, runner, batch_idx: int, mode: str) -> tuple[dict, str]:
        tag, log_str = super().get_log_after_iter(runner, batch_idx, mode)
        if mode != 'train':
            return tag, log_str
        fresh = getattr(runner.train_loop, 'step_metrics', None)
        if fresh is not None:
            tag = {k: v for k, v in tag.items()
                   if k in fresh or k in PER_ITER_KEYS or k.endswith('lr')}
        parts = [log_str.split('  lr:')[0].split('  time:')[0]]
        eta = runner.message_hub.get_info('eta')
        if eta is not None:
            parts.append(f'eta {int(eta) // 60}m{int(eta) % 60:02d}s')
        if 'lr' in tag:
            parts.append(f'lr {tag["lr"]:.0e}')
        parts += [f'{label} ' + '/'.join(f'{tag[k]:.3g}' for k in keys)
                  for label, keys in self.summary if all(k in tag for k in keys)]
        return tag, '  '.join(parts)


@VISBACKENDS.register_module()
class OptionalTensorboardVisBackend(TensorboardVisBackend):
    """TensorBoard scalars when ``tensorboard`` is installed; otherwise nothing (no error)."""

    def _init_env(self) -> None:
        try:
            super()._init_env()
        except ImportError:
            self._tensorboard = None

    def add_scalar(self, *args, **kwargs) -> None:
        if self.experiment is not None:
            super().add_scalar(*args, **kwargs)

    def add_scalars(self, *args, **kwargs) -> None:
        if self.experiment is not None:
            super().add_scalars(*args, **kwargs)

    def add_config(self, *args, **kwargs) -> None:
        if self.experiment is not None:
            super().add_config(*args, **kwargs)

    def close(self) -> None:
        if getattr(self, '_tensorboard', None) is not None:
            super().close()


class StageClock:
    """Wall-clock seconds of named stages: ``with clock('update'): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.seconds[stage] = time.perf_counter() - start
