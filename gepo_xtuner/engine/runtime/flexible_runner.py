"""mmengine's FlexibleRunner and DeepSpeed strategy for the RL loop: CPU processes, hooks'
state in DeepSpeed checkpoints."""

from collections.abc import Callable

from mmengine._strategy import DeepSpeedStrategy
from mmengine.registry import RUNNERS, STRATEGIES
from mmengine.runner import FlexibleRunner

from .runner import init_cpu_process_group


@RUNNERS.register_module()
class RLFlexibleRunner(FlexibleRunner):
    """``FlexibleRunner`` that also starts data-parallel processes without CUDA.

    mmengine's strategies set up the process group with ``init_dist``, which calls
    ``torch.cuda.set_device``; on a CPU machine this runner creates the group first
    (``gloo`` unless ``env_cfg.dist_cfg.backend`` says otherwise), as
    :class:`~gepo_xtuner.engine.runtime.runner.RLRunner` does. With CUDA nothing changes.

    It also loads or resumes a checkpoint after ``before_run``, not before it, as
    mmengine's ``Runner`` does (see :meth:`load_or_resume`).

    Config: ``runner_type = 'RLFlexibleRunner'`` with ``strategy =
    dict(type='RLDeepSpeedStrategy', config=...)`` and a ``DeepSpeedOptimWrapper``
    (``configs/_base_/deepspeed.py``); ``xtuner train --deepspeed`` instead replaces the
    runner with mmengine's ``FlexibleRunner`` and its strategy, which lose the hooks'
    checkpoint state. See ``docs/cluster.md``.
    """

    _deferred_load = False

    def load_or_resume(self) -> None:
        """Deferred until ``before_run`` has been called, as mmengine's ``Runner`` orders
        them: hooks create the state that a resume then loads (``FlexibleRunner`` loads
        first, and the loop's state hook would find nothing to load into)."""
        self._deferred_load = True

    def call_hook(self, fn_name: str, **kwargs) -> None:
        super().call_hook(fn_name, **kwargs)
        if fn_name == 'before_run' and self._deferred_load:
            self._deferred_load = False
            super().load_or_resume()

    def build_strategy(self, strategy=None, launcher: str = 'none', randomness=None,
                       env_cfg: dict | None = None, **kwargs):
        env_cfg = env_cfg if env_cfg is not None else dict(dist_cfg=dict(backend='gloo'))
        if launcher != 'none':
            init_cpu_process_group(launcher, env_cfg)
        return super().build_strategy(strategy, launcher=launcher, randomness=randomness,
                                      env_cfg=env_cfg, **kwargs)


@STRATEGIES.register_module()
class RLDeepSpeedStrategy(DeepSpeedStrategy):
    """mmengine's ``DeepSpeedStrategy`` that runs the checkpoint hooks.

    mmengine 0.10's strategy ignores the ``callback`` through which ``FlexibleRunner``
    calls ``before_save_checkpoint`` and ``after_load_checkpoint``, so state that hooks
    own (GEPO's entropy band, the RL loop's RNG and counters) would be neither saved
    nor resumed. Here the callback fills the extra checkpoint before DeepSpeed saves it
    as its client state, and sees the client state after a load or resume.
    """

    def __init__(self, *args, **kwargs) -> None:
        # FlexibleRunner fills this in for a strategy named exactly 'DeepSpeedStrategy'.
        # DeepSpeed requires it, but the loop forms its own micro-batches by tokens.
        kwargs.setdefault('train_micro_batch_size_per_gpu', 1)
        super().__init__(*args, **kwargs)

    def save_checkpoint(self, filename: str, *, extra_ckpt: dict | None = None,
                        callback: Callable | None = None, **kwargs) -> None:
        extra_ckpt = {} if extra_ckpt is None else extra_ckpt
        if callback is not None:
            callback(extra_ckpt)
        super().save_checkpoint(filename, extra_ckpt=extra_ckpt, **kwargs)

    def load_checkpoint(self, filename: str, *, callback: Callable | None = None,
                        **kwargs) -> dict:
        checkpoint = super().load_checkpoint(filename, **kwargs)
        if callback is not None:
            callback(checkpoint)
        return checkpoint

    def resume(self, filename: str, *, callback: Callable | None = None, **kwargs) -> dict:
        checkpoint = super().resume(filename, **kwargs)
        if callback is not None:
            callback(checkpoint)
        return checkpoint
