"""Export the policy as a Hugging Face directory at the end of training (and at intervals)."""

import shutil
from pathlib import Path

from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


@HOOKS.register_module()
class HFExportHook(Hook):
    """Writes the trained policy as a Hugging Face model directory, as XTuner's
    ``HFCheckpointHook`` does for SFT.

    At the end of training it writes ``<work_dir>/<out_dir>`` (default ``hf``); with
    ``interval > 0`` also ``<work_dir>/<out_dir>_iter_<N>`` every ``interval`` RL steps.
    Each is a complete ``from_pretrained`` directory (weights in the training dtype,
    tokenizer with chat template, processor for vision-language models), written under
    a temporary name and renamed into place (:func:`~gepo_xtuner.model.export.save_hf_directory`).
    The same directory comes from a saved checkpoint with ``tools/export_hf.py``.

    Args:
        interval: export every ``interval`` steps as well; ``<= 0`` (default): at the end only.
        out_dir: directory name under the work directory (or an absolute path).
        max_keep: interval exports to keep (oldest removed first); None keeps all.
    """

    priority = 'LOW'

    def __init__(self, interval: int = -1, out_dir: str = 'hf', max_keep: int | None = None
                 ) -> None:
        if not isinstance(interval, int):
            raise TypeError(f'HFExportHook.interval must be an int, got {interval!r}')
        if max_keep is not None and (not isinstance(max_keep, int) or max_keep < 1):
            raise ValueError(f'HFExportHook.max_keep must be None or >= 1, got {max_keep!r}')
        self.interval = interval
        self.out_dir = out_dir
        self.max_keep = max_keep
        self._kept: list[Path] = []

    def _target(self, runner, suffix: str = '') -> Path:
        base = Path(self.out_dir)
        if not base.is_absolute():
            base = Path(runner.work_dir) / base
        return base.with_name(base.name + suffix)

    def _export(self, runner, out: Path) -> None:
        from ...model.export import save_hf_directory  # transformers only when exporting

        policy = runner.model.module if is_model_wrapper(runner.model) else runner.model
        save_hf_directory(policy.llm, policy.tokenizer, out, processor=policy.processor)
        runner.logger.info(f'Hugging Face model directory: {out}')

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self.interval <= 0 or not self.every_n_train_iters(runner, self.interval):
            return
        if not is_main_process():
            return
        out = self._target(runner, f'_iter_{runner.iter + 1}')
        self._export(runner, out)
        self._kept.append(out)
        while self.max_keep is not None and len(self._kept) > self.max_keep:
            shutil.rmtree(self._kept.pop(0), ignore_errors=True)

    def after_train(self, runner) -> None:
        if is_main_process():
            self._export(runner, self._target(runner))
