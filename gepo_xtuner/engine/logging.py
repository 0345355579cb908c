"""Compact progress lines for RL runs; every metric still goes to the scalar backends."""

from mmengine.registry import LOG_PROCESSORS, VISBACKENDS
from mmengine.runner import LogProcessor
from mmengine.visualization import TensorboardVisBackend

SUMMARY = ('reward/mean', 'val/acc', 'adv/frac_zero', 'entropy/group_mean', 'entropy/policy',
           'gepo/h_low', 'gepo/h_high', 'shaping/frac_damped_pos', 'shaping/frac_damped_neg',
           'shaping/frac_removed', 'loss/pg', 'loss/clipfrac', 'loss/approx_kl', 'optim/grad_norm', 'perf/gen_tokens_per_sec',
           'time/step')
#: What mmengine's own hooks record at every iteration (kept in every step's scalars).
PER_ITER_KEYS = ('lr', 'time', 'data_time', 'grad_norm')


@LOG_PROCESSORS.register_module()
class RLLogProcessor(LogProcessor):
    """Prints a one-line step summary; the scalar backends receive every metric.

    With dozens of per-domain metrics per step, mmengine's default line is
    unreadable. The printed line is restricted to ``summary_keys`` (those present),
    plus step counter, learning rate and ETA.

    The tag (what visualizer backends and ``scalars.json`` get) holds only what
    was measured at this step: the RL loop's metrics of the step
    (``RLTrainLoop.step_metrics``) and mmengine's per-iteration values. mmengine's
    message hub keeps every key it has seen, so without this a step without
    validation (or without a domain in its batch) would repeat the last value.

    Args:
        summary_keys: metric names to print.
        **kwargs: :class:`mmengine.runner.LogProcessor` arguments.
    """

    def __init__(self, summary_keys: tuple[str, ...] = SUMMARY, **kwargs) -> None:
        kwargs.setdefault('by_epoch', False)
        kwargs.setdefault('window_size', 1)
        super().__init__(**kwargs)
        self.summary_keys = tuple(summary_keys)

    def get_log_after_iter(self, runner, batch_idx: int, mode: str) -> tuple[dict, str]:
        tag, log_str = super().get_log_after_iter(runner, batch_idx, mode)
        if mode != 'train':
            return tag, log_str
        fresh = getattr(runner.train_loop, 'step_metrics', None)
        if fresh is not None:
            tag = {k: v for k, v in tag.items()
                   if k in fresh or k in PER_ITER_KEYS or k.endswith('lr')}
        head = log_str.split('  lr:')[0].split('  time:')[0]
        parts = [head]
        if 'lr' in tag:
            parts.append(f'lr: {tag["lr"]:.3e}')
        eta = runner.message_hub.get_info('eta')
        if eta is not None:
            parts.append(f'eta: {int(eta) // 60}m{int(eta) % 60:02d}s')
        parts += [f'{k}: {tag[k]:.4g}' for k in self.summary_keys if k in tag]
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
