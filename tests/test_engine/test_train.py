"""Real ``python -m xtuner.tools.train`` runs of the tiny CPU config."""

import json
import math

import pytest
import torch

from .conftest import scalars, train, write_config

VOLATILE = ('time', 'data_time', 'eta')  # wall-clock figures differ between runs


def comparable(row: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in row.items()
            if not k.startswith(('time', 'perf/gen_tokens_per_sec')) and k not in VOLATILE}


def load_ckpt(path):
    return torch.load(path, map_location='cpu', weights_only=False)  # our own test file


def test_short_run_learns_logs_and_checkpoints(tmp_path, tiny_dir):
    cfg = write_config(tmp_path)
    work = tmp_path / 'run'
    # a fresh interpreter: the console from the first import on is part of what is checked
    proc = train(cfg, work, tiny_dir, 'train_cfg.max_steps=4', fresh=True)
    logged = scalars(work)
    assert set(range(1, 5)) <= set(logged)
    step = logged[4]
    for key in ('reward/mean', 'entropy/group_nll_mean', 'gepo/h_low', 'gepo/h_high', 'loss/pg',
                'loss/clipfrac', 'loss/approx_kl', 'entropy/policy', 'time/rollout',
                'time/reward', 'time/update', 'time/sync', 'perf/gen_tokens_per_sec'):
        assert key in step and math.isfinite(step[key]), key
    assert any(k.startswith('entropy/group_nll/') for k in step)
    assert any(k.startswith('reward/mean/') for k in step)
    assert 'val/acc' in logged[0] and 'val/acc' in logged[4]
    assert any(0 < logged[s]['reward/mean'] < 1 for s in range(1, 5))  # signal existed
    # parameters changed
    before = torch.load(tiny_dir / 'model' / 'pytorch_model.bin', weights_only=True) \
        if (tiny_dir / 'model' / 'pytorch_model.bin').exists() else None
    if before is None:
        from safetensors.torch import load_file
        before = load_file(tiny_dir / 'model' / 'model.safetensors')
    after = load_ckpt(work / 'iter_4.pth')['state_dict']
    changed = [k for k, v in before.items() if not torch.equal(v, after['llm.' + k])]
    assert changed, 'no parameter moved'
    # the loop's processor state is in the checkpoint and is what step 5 would use
    state = load_ckpt(work / 'iter_4.pth')['gepo_xtuner/rl_loop']['advantage']
    assert state['processor'] == 'GEPOAdvantage' and state['state']['num_updates'] == 4
    ckpt2 = load_ckpt(work / 'iter_2.pth')['gepo_xtuner/rl_loop']['advantage']['state']
    assert ckpt2['h_low'] == logged[3]['gepo/h_low']  # step 3 shaped with the saved band
    assert (work / 'training_curves.png').read_bytes()[:4] == b'\x89PNG'
    assert 'training_curves.png' in proc.stdout + proc.stderr
    if not torch.cuda.is_available():  # bitsandbytes' CPU-build notice (_gepo_xtuner_quiet.py)
        assert 'compiled without GPU support' not in proc.stdout + proc.stderr


def test_resume_reproduces_the_uninterrupted_run(tmp_path, tiny_dir):
    cfg = write_config(tmp_path)
    full, resumed = tmp_path / 'full', tmp_path / 'resumed'
    proc = train(cfg, full, tiny_dir, 'train_cfg.max_steps=4')
    # the start-up line says how GEPO's band begins
    assert "GEPO entropy band starts at the first batch's own statistics" in (proc.stdout
                                                                              + proc.stderr)
    proc = train(cfg, resumed, tiny_dir, 'train_cfg.max_steps=4', '--resume',
                 str(full / 'iter_2.pth'))
    out = proc.stdout + proc.stderr
    assert 'GEPO entropy band continues from the checkpoint: 2 steps folded in' in out
    assert 'resumed with changed settings' not in out
    a, b = scalars(full), scalars(resumed)
    assert 1 not in b and 2 not in b, 'the resumed run re-ran finished steps'
    for step in (3, 4):
        assert comparable(a[step]) == comparable(b[step]), step
        assert a[step]['optim/steps'] == 2 and a[step]['optim/micro_batches'] > 1, a[step]
    torch.testing.assert_close(load_ckpt(full / 'iter_4.pth')['state_dict'],
                               load_ckpt(resumed / 'iter_4.pth')['state_dict'], rtol=0, atol=0)


def test_resumed_seeded_clip_cov_run_is_bit_exact(tmp_path, tiny_dir):
    """Clip-Cov with ``seed=`` draws its tokens from its own generator, which is checkpointed."""
    cfg = write_config(tmp_path, extra="""
        model = dict(policy_loss=dict(_delete_=True, type='ClipCovLoss', seed=7, clip_cov_ratio=0.2,
                                      clip_cov_lb=-100.0, clip_cov_ub=100.0, importance='cispo'))
    """)
    full, resumed = tmp_path / 'full', tmp_path / 'resumed'
    train(cfg, full, tiny_dir, 'train_cfg.max_steps=4')
    train(cfg, resumed, tiny_dir, 'train_cfg.max_steps=4', '--resume', str(full / 'iter_2.pth'))
    a, b = scalars(full), scalars(resumed)
    for step in (3, 4):
        assert a[step]['loss/cov_tokens'] > 0
        assert comparable(a[step]) == comparable(b[step]), step
    torch.testing.assert_close(load_ckpt(full / 'iter_4.pth')['state_dict'],
                               load_ckpt(resumed / 'iter_4.pth')['state_dict'], rtol=0, atol=0)


def test_gepo_shaped_rloo_trains(tmp_path, tiny_dir):
    """A shaper around a non-default estimator, configured in the config file only."""
    cfg = write_config(tmp_path, extra="""
        train_cfg = dict(advantage=dict(base=dict(type='RLOOAdvantage')))
    """)
    work = tmp_path / 'run'
    proc = train(cfg, work, tiny_dir, 'train_cfg.max_steps=2', 'train_cfg.val.interval=100')
    assert 'base=RLOOAdvantage()' in proc.stdout + proc.stderr
    logged = scalars(work)
    for step in (1, 2):
        for key in ('gepo/h_low', 'gepo/h_high', 'shaping/frac_damped_pos',
                    'shaping/frac_damped_neg', 'loss/pg'):
            assert math.isfinite(logged[step][key]), (step, key)
    state = load_ckpt(work / 'iter_2.pth')['gepo_xtuner/rl_loop']['advantage']
    assert state['processor'] == 'GEPOAdvantage' and state['state']['num_updates'] == 2
    # one gradient norm, no repeated loss, strict JSON, a short console line, no notices
    for step in (1, 2):
        assert 'optim/grad_norm' in logged[step]
        assert 'grad_norm' not in logged[step] and 'loss' not in logged[step], logged[step]
    for path in work.glob('*/vis_data/scalars.json'):
        for line in path.read_text().splitlines():
            json.loads(line, parse_constant=lambda c: pytest.fail(f'{c} in {path}'))
    out = proc.stdout + proc.stderr
    lines = [line for line in out.splitlines() if 'Iter(train)' in line]
    assert len(lines) == 2 and all(len(line) <= 200 for line in lines), lines
    for notice in ('From v4.47 onwards', 'Reach the end of the dataloader'):
        assert notice not in out


def test_any_shapers_band_reaches_the_console_and_the_figure(tmp_path, tiny_dir):
    """A shaper written for this test (``plugins.QuartileBandShaper``, no GEPO name) returns a
    band; the loop logs it as ``band/low|high``, which the console line and the figure read."""
    from gepo_xtuner.analysis.curves import band_series
    cfg = write_config(tmp_path, extra="""
        train_cfg = dict(advantage=dict(_delete_=True, type='QuartileBandShaper'))
    """)
    work = tmp_path / 'run'
    proc = train(cfg, work, tiny_dir, 'train_cfg.max_steps=2', 'train_cfg.val.interval=100')
    logged = scalars(work)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if 'Iter(train)' in line]
    assert len(lines) == 2
    for step, line in zip((1, 2), lines):
        low, high = logged[step]['band/low'], logged[step]['band/high']
        assert low <= high and 'quartile/iqr' in logged[step]
        assert not any(key.startswith('gepo/') for key in logged[step]), logged[step]
        assert f'band {low:.3g}/{high:.3g}' in line, line
    history = json.loads((work / 'training_curves.json').read_text())
    steps, low, high = band_series(history)
    assert steps == [1.0, 2.0] and low == [logged[1]['band/low'], logged[2]['band/low']]
    assert (work / 'training_curves.png').read_bytes()[:4] == b'\x89PNG'


def test_a_checkpoint_without_processor_state_warns_and_resumes(tmp_path, tiny_dir):
    cfg = write_config(tmp_path)
    full = tmp_path / 'full'
    train(cfg, full, tiny_dir, 'train_cfg.max_steps=2')
    ckpt = load_ckpt(full / 'iter_2.pth')
    assert set(k for k in ckpt if k.startswith('gepo_xtuner/')) == {'gepo_xtuner/rl_loop',
                                                                    'gepo_xtuner/run_health'}
    del ckpt['gepo_xtuner/rl_loop']['advantage']
    del ckpt['gepo_xtuner/run_health']  # a checkpoint of a run without RunHealthHook
    bare = tmp_path / 'bare.pth'
    torch.save(ckpt, bare)
    proc = train(cfg, tmp_path / 'second', tiny_dir, 'train_cfg.max_steps=3', '--resume',
                 str(bare))
    assert 'checkpoint has no advantage state for GEPOAdvantage' in proc.stdout + proc.stderr
    assert "checkpoint has no 'gepo_xtuner/run_health' entry" in proc.stdout + proc.stderr
    assert 3 in scalars(tmp_path / 'second')


def test_failing_reward_scores_zero_warns_and_training_goes_on(tmp_path, tiny_dir):
    records = [json.loads(x) for x in (tiny_dir / 'data' / 'train.jsonl').read_text().splitlines()]
    fail = [r['id'] for r in records[::3]]
    cfg = write_config(tmp_path, extra=f"""
        train_cfg = dict(rewards=dict(default=dict(_delete_=True, type='FlakyReward',
                                                   fail_ids={fail!r})))
    """)
    proc = train(cfg, tmp_path / 'run', tiny_dir, 'train_cfg.max_steps=2',
                 'train_cfg.rewards.default.type=FlakyReward')
    out = proc.stdout + proc.stderr
    assert 'verifier crashed on' in out and 'scoring 0' in out
    logged = scalars(tmp_path / 'run')
    errors = sum(v for s in (1, 2) for k, v in logged[s].items() if k.startswith('reward/errors/'))
    assert errors > 0
    assert 2 in logged


def test_malformed_dataset_line_fails_before_training(tmp_path, tiny_dir):
    bad = tmp_path / 'tiny'
    (bad / 'data').mkdir(parents=True)
    (bad / 'model').symlink_to(tiny_dir / 'model')
    lines = (tiny_dir / 'data' / 'train.jsonl').read_text().splitlines()
    lines[2] = '{"prompt": "1+1", "domain": "add", "answer": '  # truncated line 3
    (bad / 'data' / 'train.jsonl').write_text('\n'.join(lines) + '\n')
    (bad / 'data' / 'val.jsonl').write_text((tiny_dir / 'data' / 'val.jsonl').read_text())
    proc = train(write_config(tmp_path), tmp_path / 'run', bad, 'train_cfg.max_steps=2',
                 check=False)
    assert proc.returncode != 0
    assert f'{bad / "data" / "train.jsonl"}:3: not valid JSON' in proc.stderr
    assert 'Iter(train)' not in proc.stdout + proc.stderr


def test_config_error_exits_non_zero(tmp_path, tiny_dir):
    proc = train(write_config(tmp_path), tmp_path / 'run', tiny_dir,
                 'train_cfg.advantage.alpha_low=5', check=False)
    assert proc.returncode != 0
    assert 'alpha_low must be in [0.0, 1.0], got 5' in proc.stderr


def test_aepo_trains_kept_rows_in_fewer_full_minibatches(tmp_path, tiny_dir):
    """AEPO's gate is on at every step (``entropy_low=0``) and ShortAnswerReward gives mixed
    rewards, so each step keeps the responses with positive advantage and reward, a
    fraction the log states. The kept rows are trained as AEPO's authors did (verl v0.4
    ``dp_actor``: ``batch.split(ppo_mini_batch_size)``): ``ceil(kept / minibatch)``
    optimizer steps of ``minibatch`` rows (the last holds the rest), not the full
    batch's 4 steps with the kept rows spread over them."""
    cfg = write_config(tmp_path, extra="""
        train_cfg = dict(advantage=dict(_delete_=True, type='AEPOAdvantage', entropy_low=0.0))
    """)
    work = tmp_path / 'run'
    train(cfg, work, tiny_dir, 'train_cfg.max_steps=2', 'train_dataloader.batch_size=8',
          'train_cfg.minibatch_responses_per_rank=8', 'train_cfg.val.interval=100')
    responses, minibatch = 8 * 4, 8
    logged = scalars(work)
    kept_per_step = []
    for step in (1, 2):
        row = logged[step]
        kept = row['optim/rows_trained']
        kept_per_step.append(kept)
        assert row['aepo/positive_only'] == 1.0 and kept == responses * row['aepo/frac_kept']
        steps = math.ceil(kept / minibatch)  # 0 when nothing is kept: no update
        assert row['optim/steps'] == steps, (step, row)
        if steps:
            assert row['optim/minibatch_rows'] == kept / steps  # full minibatches, the rest
    # rows were removed and the kept ones took fewer steps than the full batch's 4
    assert any(0 < k <= responses - minibatch for k in kept_per_step), kept_per_step
