"""tools/run_experiments.py runs real `xtuner train` grids, resumes killed runs and reports them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gepo_xtuner.testbed.experiments import load_history, summarize_run
from tests import preloaded

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / 'tools' / 'run_experiments.py'
# CI-sized runs: 4 prompts x 4 responses per step, short answers, validation every 2 steps
# and a checkpoint every 2 steps (as tests/test_engine/conftest.py's FAST settings)
SMALL = ['train_dataloader.batch_size=4', 'train_cfg.num_responses=4',
         'train_cfg.minibatch_responses_per_rank=8', 'train_cfg.sampling.max_new_tokens=6',
         'train_cfg.val.interval=2', 'default_hooks.checkpoint.interval=2']


@pytest.fixture(scope='module')
def tiny(tmp_path_factory) -> Path:
    """A randomly initialised tiny policy and small task files (no warm start)."""
    from gepo_xtuner.testbed.synthetic_tasks import build_task_files
    from gepo_xtuner.testbed.tiny import build_char_tokenizer, build_tiny_model
    out = tmp_path_factory.mktemp('tiny')
    tok = build_char_tokenizer()
    build_tiny_model(len(tok), seed=0).save_pretrained(out / 'model')
    tok.save_pretrained(out / 'model')
    build_task_files(out / 'data', n_train_per_domain=50, n_val_per_domain=4, seed=0)
    return out


def measured(row: dict) -> dict:
    """A history row without its wall-clock figures."""
    return {k: v for k, v in row.items() if not k.startswith(('time/', 'perf/gen_tokens_per'))}


def harness(tiny: Path, work: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', None)  # as a user's shell
    proc = preloaded.run(
        [sys.executable, str(TOOL), '--methods', 'gepo', 'grpo', '--seeds', '1', '--steps', '3',
         '--tiny-dir', str(tiny), '--work-dir', str(work), '--cfg-options', *SMALL, *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def test_grid_report_from_real_runs_then_skip_and_resume(tiny, tmp_path):
    work = tmp_path / 'grid'
    first = harness(tiny, work, '--jobs', '2')
    assert '2 runs: 0 already finished, 2 to run, 2 at once' in first.stdout
    report = work / 'report'
    for fig in ('fig3_validation.png', 'fig4_policy_entropy.png', 'fig5_group_entropy.png'):
        assert (report / fig).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    text = (report / 'results.md').read_text()
    assert '## Table 1' in text and '- GEPO: final avg' in text
    # the table holds the runs' own numbers: GRPO's final average is its last validation
    grpo = load_history(work / 'grpo' / 'seed0')
    final = [r for r in grpo if r.get('val/acc') is not None][-1]
    assert final['step'] == 3.0
    row = next(line for line in text.splitlines() if line.startswith('| GRPO |'))
    assert f'{final["val/acc"]:.3f}' in row.split('|')[-2]
    saved = json.loads((report / 'results.json').read_text())
    assert saved['runs']['grpo'][0]['final']['avg'] == pytest.approx(
        summarize_run(grpo)['final']['avg'])

    # a run killed after its step-2 checkpoint: no history, last_checkpoint -> iter_2.pth
    run = work / 'grpo' / 'seed0'
    (run / 'training_curves.json').unlink()
    (run / 'iter_3.pth').unlink()
    (run / 'last_checkpoint').write_text(str(run / 'iter_2.pth'))
    second = harness(tiny, work, '--jobs', '1')
    assert '2 runs: 1 already finished, 1 to run' in second.stdout
    assert 'start grpo/seed0 (resuming iter_2.pth)' in second.stdout
    assert '--resume' in (run / 'run.log').read_text()
    # one thread, same machine: the resumed run ends exactly where the uninterrupted one did
    assert [measured(r) for r in load_history(run)] == [measured(r) for r in grpo]


def test_unknown_method_is_refused_with_the_choices(tiny, tmp_path):
    proc = preloaded.run([sys.executable, str(TOOL), '--methods', 'ppo', '--tiny-dir',
                          str(tiny), '--work-dir', str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode != 0
    assert "no config for ['ppo']" in proc.stderr and 'gepo_wo_low' in proc.stderr


@pytest.mark.parametrize('method', ['grpo', 'aepo', 'clip_cov', 'kl_cov', 'gepo', 'gepo_wo_low',
                                    'gepo_wo_high', 'gepo_symmetric'])
def test_each_experiment_is_its_algorithm_base_on_the_testbed(method):
    """The grid compares the algorithms as configs/_base_/algorithms/ define them."""
    from mmengine.config import Config

    from gepo_xtuner.registry import ADVANTAGES, POLICY_LOSSES
    cfg = Config.fromfile(str(ROOT / 'configs' / 'experiments' / f'{method}.py'))
    algo = Config.fromfile(str(ROOT / 'configs' / '_base_' / 'algorithms' / f'{method}.py'))
    # AEPO's unpublished threshold is set to this policy's entropy range (configs/experiments)
    tuned = {'aepo': dict(entropy_low=0.4)}.get(method, {})
    assert cfg.train_cfg.advantage == {**algo.advantage, **tuned}
    # the algorithm base's loss; the testbed adds only the token-mean aggregation where the
    # base leaves it to the loss's default
    assert cfg.model.policy_loss == {'agg': 'token-mean', **algo.policy_loss}
    assert cfg.train_cfg.max_tokens_per_micro_batch == algo.micro_batch_tokens
    ADVANTAGES.build(cfg.train_cfg.advantage)
    POLICY_LOSSES.build(cfg.model.policy_loss)
    grid = Config.fromfile(str(ROOT / 'configs' / 'experiments' / 'grpo.py'))
    for key in ('train_dataloader', 'optim_wrapper', 'param_scheduler', 'randomness'):
        assert cfg[key] == grid[key], key  # everything but the algorithm is shared
    assert {k: v for k, v in cfg.train_cfg.items() if k not in ('advantage',
            'max_tokens_per_micro_batch')} == {k: v for k, v in grid.train_cfg.items() if k not in
                                               ('advantage', 'max_tokens_per_micro_batch')}
