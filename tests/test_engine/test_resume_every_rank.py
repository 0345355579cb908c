"""Resume at every step of a short run on 2 and 3 gloo ranks, under DDP and DeepSpeed ZeRO-2.

Each rank samples with its own random streams and the ranks consume different numbers
of draws (responses of different lengths), so a checkpoint must restore every rank's
own state. The straight run is trained once per setting and reused for every resume
point; the resumed runs must log the same value for every metric of every later step
and end with bit-identical weights. The geometry is ``train_dataloader.batch_size=8
num_responses=4 minibatch_responses_per_rank=16``. The tiny random policy's responses all run to the
length limit, so its ranks would consume equal numbers of draws; mmengine's per-rank
seeds (``randomness.diff_rank_seed=True``) make the ranks' streams differ from the
first step, as responses of different lengths do with a trained policy. With rank 0's
state restored on every rank (the earlier behaviour) a 2-rank run resumed at step 1
differs in 36 (step, metric) pairs and one resumed at step 2 in 11.

``make test`` resumes the 2-rank DDP run at every step and the 3-rank ZeRO-2 run at step 1
(two steps after it; one 3-rank DeepSpeed run less on 2 cores); ZeRO-2 at every step, 3-rank
DDP and 2-rank ZeRO-2 are ``slow``.
"""

import math
import shutil
import sys
from pathlib import Path

import pytest
import torch

from .conftest import scalars, train, train_ranks, write_config
from .test_deepspeed_train import _client_state, _zero_weights, deepspeed_deps  # noqa: F401

STEPS = 3
GEOMETRY = ['train_dataloader.batch_size=8', 'train_cfg.num_responses=4',
            'train_cfg.minibatch_responses_per_rank=16', 'default_hooks.checkpoint.interval=1',
            'default_hooks.checkpoint.max_keep_ckpts=-1', 'train_cfg.val.interval=100',
            'randomness.diff_rank_seed=True']
CONFIGS = {'ddp': 'gepo_tiny_cpu.py', 'zero2': 'deepspeed/gepo_tiny_cpu_zero.py'}


def learning(row: dict[str, float]) -> dict[str, float]:
    """A step's logged figures less the timings (NaN made comparable)."""
    return {k: ('nan' if isinstance(v, float) and math.isnan(v) else v)
            for k, v in row.items()
            if not k.startswith(('time/', 'perf/')) and k not in ('time', 'data_time')}


def loop_state(checkpoint: Path) -> dict:
    if checkpoint.is_dir():  # DeepSpeed: the client state beside DeepSpeed's own
        return _client_state(checkpoint)['gepo_xtuner/rl_loop']
    return torch.load(checkpoint, map_location='cpu', weights_only=False)['gepo_xtuner/rl_loop']


def weights(checkpoint: Path, deps: Path | None) -> dict[str, torch.Tensor]:
    if not checkpoint.is_dir():
        state = torch.load(checkpoint, map_location='cpu', weights_only=False)['state_dict']
        return {k.removeprefix('llm.'): v for k, v in state.items()}
    sys.path.insert(0, str(deps))
    try:
        return {k.removeprefix('llm.'): v for k, v in _zero_weights(checkpoint).items()}
    finally:
        sys.path.remove(str(deps))


@pytest.fixture(scope='module')
def straight_runs(tmp_path_factory, tiny_dir):
    """One uninterrupted run per (engine, world size), made on first use."""
    runs: dict[tuple[str, int], Path] = {}

    def get(engine: str, world: int, deps: Path | None) -> Path:
        if (engine, world) not in runs:
            tmp = tmp_path_factory.mktemp(f'{engine}{world}')
            cfg = write_config(tmp, base=CONFIGS[engine])
            out = train_ranks(cfg, tmp / 'run', tiny_dir, world, *GEOMETRY,
                              f'train_cfg.max_steps={STEPS}', deps=deps)
            assert (tmp / 'run' / f'iter_{STEPS}.pth').exists(), out[-6000:]
            runs[engine, world] = tmp / 'run'
        return runs[engine, world]
    return get


EVERY = tuple(range(1, STEPS))


@pytest.mark.parametrize('engine,world,points', [
    ('ddp', 2, EVERY), ('zero2', 3, (1,)),
    pytest.param('zero2', 3, EVERY, marks=pytest.mark.slow),
    pytest.param('ddp', 3, EVERY, marks=pytest.mark.slow),
    pytest.param('zero2', 2, EVERY, marks=pytest.mark.slow)])
def test_resumed_at_every_step_equals_the_straight_run(engine, world, points, tmp_path,
                                                        tiny_dir, straight_runs, request,
                                                        monkeypatch):
    deps = request.getfixturevalue('deepspeed_deps') if engine == 'zero2' else None
    monkeypatch.setenv('GEPO_ZERO_STAGE', '2')
    full = straight_runs(engine, world, deps)
    saved = [loop_state(full / f'iter_{k}.pth')['ranks'] for k in range(1, STEPS)]
    assert all(len(ranks) == world for ranks in saved)
    # the hazard is there: at some resume point the ranks' random streams differ
    assert any(not torch.equal(r[0]['rng']['torch'], r[i]['rng']['torch'])
               for r in saved for i in range(1, world))
    cfg = write_config(tmp_path, base=CONFIGS[engine])
    expected = scalars(full)
    final = weights(full / f'iter_{STEPS}.pth', deps)
    for k in points:
        work = tmp_path / f'resumed_at_{k}'
        out = train_ranks(cfg, work, tiny_dir, world, *GEOMETRY, f'train_cfg.max_steps={STEPS}',
                          '--resume', str(full / f'iter_{k}.pth'), deps=deps)
        assert (work / f'iter_{STEPS}.pth').exists(), out[-6000:]
        assert 'resumed with changed settings' not in out
        got = scalars(work)
        assert sorted(got) == list(range(k + 1, STEPS + 1)), (k, sorted(got))
        for step in range(k + 1, STEPS + 1):
            assert learning(got[step]) == learning(expected[step]), (k, step)
        resumed = weights(work / f'iter_{STEPS}.pth', deps)
        assert all(torch.equal(resumed[name], final[name]) for name in final), k


def test_changed_settings_and_world_size_are_explained(tmp_path, tiny_dir, straight_runs):
    """A 2-rank checkpoint resumed by one process with other settings says what changed."""
    full = straight_runs('ddp', 2, None)
    cfg = write_config(tmp_path)
    proc = train(cfg, tmp_path / 'changed', tiny_dir, *GEOMETRY, 'train_cfg.num_responses=8',
                 'train_cfg.max_steps=3', '--resume', str(full / 'iter_2.pth'))
    out = proc.stdout + proc.stderr
    assert 'the checkpoint was written by 2 training processes, this run has 1' in out
    assert 'resumed with changed settings: num_responses: 4 -> 8: groups now hold 8' in out
    assert 'resumed with changed settings: world_size: 2 -> 1' in out
    assert 'resumed with changed settings: max_steps' not in out
    assert scalars(tmp_path / 'changed')[3]['optim/rows_trained'] == 8 * 8


def test_resume_with_nothing_left_to_train_fails_and_writes_nothing(tmp_path, tiny_dir,
                                                                   straight_runs):
    full = straight_runs('ddp', 2, None)
    work = tmp_path / 'run'
    shutil.copytree(full, work)
    before = {p: p.read_bytes() for p in work.rglob('*') if p.is_file()}
    assert work / 'training_curves.png' in before
    cfg = write_config(tmp_path)
    proc = train(cfg, work, tiny_dir, *GEOMETRY, f'train_cfg.max_steps={STEPS}', '--resume',
                 str(work / f'iter_{STEPS}.pth'), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1
    assert (f'nothing left to train: the checkpoint is at step {STEPS} and '
            f'train_cfg.max_steps is {STEPS}') in out
    for path, data in before.items():  # the figure, checkpoints and logs untouched
        if path.name != 'cfg.py':  # mmengine's dump of the config, written before any step
            assert path.read_bytes() == data, path
    assert not any(p.name.startswith('iter_') and p not in before for p in work.iterdir())
