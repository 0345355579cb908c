"""The private parts of mmengine this package uses (``engine/runtime/mmengine_private.py``), run
against the installed mmengine with a real ``Runner``, its own ``IterBasedTrainLoop`` and
``CheckpointHook``: a release that renames or changes one fails here."""

from pathlib import Path

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.runner import Runner

from gepo_xtuner.engine.runtime.mmengine_private import (
    checkpoint_due, checkpoint_hook, resumed_entry, resuming, save_checkpoint_now)

STEPS = 7


class Line(BaseModel):
    """A one-parameter model with a loss, for mmengine's own train loop."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, inputs, data_samples=None, mode='tensor'):
        return {'loss': ((self.w - 1.0) ** 2).sum()}


class Predict(Hook):
    """Records, before the CheckpointHook runs, which steps ``checkpoint_due`` expects it
    to save at (1-based)."""

    priority = 'LOW'  # after_train_iter before CheckpointHook's VERY_LOW

    def __init__(self) -> None:
        self.due: list[int] = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if checkpoint_due(runner, runner.train_loop.max_iters):
            self.due.append(runner.iter + 1)


def runner(work_dir: Path, checkpoint: dict, **kwargs) -> Runner:
    return Runner(
        model=Line(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=[dict(inputs=i) for i in range(4)], batch_size=1,
                              collate_fn=dict(type='default_collate'),
                              sampler=dict(type='DefaultSampler', shuffle=False)),
        train_cfg=dict(by_epoch=False, max_iters=STEPS),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', **checkpoint)),
        custom_hooks=[dict(type=Predict)] if 'custom_hooks' not in kwargs else None,
        **{k: v for k, v in kwargs.items() if k != 'custom_hooks'})


def saved(work_dir: Path) -> list[int]:
    """1-based steps with a checkpoint file (by-epoch files: the run's last step)."""
    names = [p.name for p in work_dir.glob('*.pth')]
    steps = [int(n[len('iter_'):-len('.pth')]) for n in names if n.startswith('iter_')]
    return sorted(steps + [STEPS] * sum(n.startswith('epoch_') for n in names))


@pytest.mark.parametrize('cfg', [
    dict(interval=1, by_epoch=False),
    dict(interval=3, by_epoch=False),
    dict(interval=3, by_epoch=False, save_last=False),
    dict(interval=4, by_epoch=False, save_begin=2),
    dict(interval=1, by_epoch=True),
])
def test_checkpoint_due_predicts_where_the_real_hook_saves(tmp_path, cfg):
    run = runner(tmp_path, cfg)
    run.train()
    (predict, ) = [h for h in run.hooks if isinstance(h, Predict)]
    assert predict.due == saved(tmp_path) and predict.due, (cfg, predict.due)


def test_resuming_tells_resume_from_load_from(tmp_path):
    first = runner(tmp_path / 'a', dict(interval=STEPS, by_epoch=False))
    first.train()
    ckpt = str(tmp_path / 'a' / f'iter_{STEPS}.pth')
    resumed = runner(tmp_path / 'b', dict(interval=1), resume=True, load_from=ckpt)
    loaded = runner(tmp_path / 'c', dict(interval=1), load_from=ckpt)
    assert resuming(resumed) and not resuming(loaded) and not resuming(first)
    assert resumed_entry(resumed, {'k': 1}, 'k', '') == 1
    assert resumed_entry(loaded, {'k': 1}, 'k', '') is None  # weights only: no run state


def test_save_checkpoint_now_writes_under_the_hooks_names_and_bookkeeping(tmp_path):
    run = runner(tmp_path, dict(interval=100, by_epoch=False, max_keep_ckpts=1,
                                filename_tmpl='ckpt_{}.pth'))
    run.train()  # 7 steps: only the last one saved (save_last)
    assert sorted(p.name for p in tmp_path.glob('*.pth')) == [f'ckpt_{STEPS}.pth']
    run.train_loop._iter = STEPS + 1  # as if two steps later, off the schedule
    where = save_checkpoint_now(run)
    assert where == str(tmp_path / f'ckpt_{STEPS + 2}.pth') and Path(where).is_file()
    # the hook's bookkeeping: max_keep_ckpts=1 removed the older file
    assert sorted(p.name for p in tmp_path.glob('*.pth')) == [f'ckpt_{STEPS + 2}.pth']
    assert (tmp_path / 'last_checkpoint').read_text().strip() == where


def test_without_a_checkpoint_hook_the_runner_saves_into_the_work_dir(tmp_path):
    run = runner(tmp_path, dict(interval=100, by_epoch=False, save_last=False))
    run.train()  # builds the optimizer wrapper; no checkpoint on this schedule
    assert not list(tmp_path.glob('*.pth'))
    run._hooks = [h for h in run.hooks if h is not checkpoint_hook(run)]
    assert checkpoint_hook(run) is None and not checkpoint_due(run, STEPS)
    where = save_checkpoint_now(run)
    assert where == f'{tmp_path}/iter_{STEPS + 1}.pth' and Path(where).is_file()
