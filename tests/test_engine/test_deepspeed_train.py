"""DeepSpeed ZeRO-2/3 through mmengine's FlexibleRunner, two CPU processes over gloo.

Real runs of ``xtuner train configs/deepspeed/gepo_tiny_cpu_zero.py`` (XTuner's launcher, torchrun,
DeepSpeed's CPU accelerator), compared with the same run under DDP: the loop's explicit
optimizer step must give the same parameters whichever engine holds them.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import cache_lock

from .conftest import ROOT, scalars, train_ranks, write_config

DEEPSPEED_DEPS = ROOT / 'work_dirs' / 'deepspeed_deps'


@pytest.fixture(scope='module')
def deepspeed_deps() -> Path:
    """The overlay of ``make deepspeed-deps`` (installed now if missing or outdated)."""
    with cache_lock('deepspeed_deps'):
        proc = subprocess.run(['make', '-s', 'deepspeed-deps', f'PY={sys.executable}'],
                              cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        if 'Could not find a version' in proc.stderr or 'NewConnectionError' in proc.stderr:
            pytest.skip('DeepSpeed (make deepspeed-deps) is not installed and the package '
                        'registry cannot be reached to install it')
        pytest.fail(f'make deepspeed-deps failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}')
    return DEEPSPEED_DEPS


def _train(cfg: Path, work: Path, tiny: Path, deps: Path | None, *options: str) -> str:
    """Two processes through ``xtuner train``; returns the output (it exits 0 on failure)."""
    return train_ranks(cfg, work, tiny, 2, *options, deps=deps)


def _zero_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Full fp32 parameters of a DeepSpeed checkpoint directory (ZeRO-3 shards gathered)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint.parent), tag=checkpoint.name)


def _client_state(checkpoint: Path) -> dict:
    """What the hooks and the runner saved beside DeepSpeed's own state (rank 0's file)."""
    name = next(p for p in sorted(checkpoint.glob('*model_states.pt')))
    return torch.load(name, map_location='cpu', weights_only=False)


@pytest.fixture(scope='module')
def ddp_weights(tmp_path_factory, tiny_dir) -> dict[str, torch.Tensor]:
    tmp = tmp_path_factory.mktemp('ddp')
    out = _train(write_config(tmp), tmp / 'run', tiny_dir, None, 'train_cfg.max_steps=2')
    assert (tmp / 'run' / 'iter_2.pth').is_file(), out[-6000:]
    state = torch.load(tmp / 'run' / 'iter_2.pth', map_location='cpu', weights_only=False)
    return {k.removeprefix('llm.'): v for k, v in state['state_dict'].items()}


def _assert_same_as_ddp(got: dict[str, torch.Tensor], ddp: dict[str, torch.Tensor],
                        tiny_dir: Path) -> None:
    from safetensors.torch import load_file
    start = load_file(tiny_dir / 'model' / 'model.safetensors')
    got = {k.removeprefix('llm.'): v for k, v in got.items()}
    assert set(start) <= set(got) and set(start) <= set(ddp)
    moved = max(float((ddp[k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-4  # two steps changed the weights well beyond the tolerance below
    for k in start:
        torch.testing.assert_close(got[k], ddp[k], atol=1e-5, rtol=0, msg=k)


@pytest.mark.parametrize('stage', [2, 3])
def test_zero_run_equals_ddp_and_resumes_exactly(tmp_path, tiny_dir, deepspeed_deps,
                                                 ddp_weights, stage, monkeypatch):
    """ZeRO-2 and ZeRO-3 give DDP's weights after two steps; ZeRO-3 also resumes from its
    step-2 checkpoint exactly. ZeRO-2's resume is checked at every step on three ranks in
    test_resume_every_rank.py (the same checkpoint format, all metrics and weights)."""
    monkeypatch.setenv('GEPO_ZERO_STAGE', str(stage))
    cfg = write_config(tmp_path, base='deepspeed/gepo_tiny_cpu_zero.py')
    work = tmp_path / 'run'
    steps = 3 if stage == 3 else 2
    out = _train(cfg, work, tiny_dir, deepspeed_deps, f'train_cfg.max_steps={steps}')
    assert (work / f'iter_{steps}.pth').is_dir(), out[-6000:]
    sys.path.insert(0, str(deepspeed_deps))
    try:
        _assert_same_as_ddp(_zero_weights(work / 'iter_2.pth'), ddp_weights, tiny_dir)
        if stage == 2:
            return
        resumed = tmp_path / 'resumed'
        resumed.mkdir()
        shutil.copytree(work / 'iter_2.pth', resumed / 'iter_2.pth')
        out = _train(cfg, resumed, tiny_dir, deepspeed_deps, 'train_cfg.max_steps=3',
                     '--resume', str(resumed / 'iter_2.pth'))
        assert (resumed / 'iter_3.pth').is_dir(), out[-6000:]
        assert 'restored GEPOAdvantage state' in out
        a, b = _zero_weights(work / 'iter_3.pth'), _zero_weights(resumed / 'iter_3.pth')
        assert all(torch.equal(a[k], b[k]) for k in a)
    finally:
        sys.path.remove(str(deepspeed_deps))
    full, part = _client_state(work / 'iter_3.pth'), _client_state(resumed / 'iter_3.pth')
    full, part = full['gepo_xtuner/rl_loop'], part['gepo_xtuner/rl_loop']
    assert full['advantage'] == part['advantage'] and full['advantage']['state']
    assert _learning(scalars(resumed)[3]) == pytest.approx(_learning(scalars(work)[3]), abs=1e-9,
                                                           nan_ok=True)


def _learning(row: dict[str, float]) -> dict[str, float]:
    """A step's logged figures less the timings."""
    return {k: v for k, v in row.items()
            if not k.startswith(('time/', 'perf/')) and k not in ('time', 'data_time')}
