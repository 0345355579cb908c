"""Smoke mode of ``tools/check_config.py`` and its parts in :mod:`gepo_xtuner.testbed.smoke`.

Unit tests: batch scaling keeps the config's structure, the generated records follow the
record schema, cover the config's reward domains and give the tiny random policy mixed
rewards under the real verifiers. Real runs: ``--smoke-steps 2 --nproc 2`` through XTuner's
training program for four algorithms of one model (about 40 s each on 2 cores); every
shipped config in the ``slow`` test.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mmengine.config import Config

import gepo_xtuner  # noqa: F401  (registers the types the configs name)
from gepo_xtuner.testbed import smoke
from gepo_xtuner.data.records import validate_record
from gepo_xtuner.engine.loop import RLTrainLoop
from gepo_xtuner.reward import RewardRouter
from tests import preloaded

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / 'tools' / 'check_config.py'
PAPER_REWARDS = dict(math=dict(type='MathReward'), physics=dict(type='NumericReward'),
                     science=dict(type='MultipleChoiceReward'), code=dict(type='CodeReward'),
                     instruction=dict(type='InstructionFollowingReward'),
                     chart=dict(type='ChartQAReward'))
SHIPPED = sorted(p.name for p in (ROOT / 'configs').glob('*.py'))


# ---- batch scaling ----

@pytest.mark.parametrize('world', [1, 2, 4, 8])
def test_paper_batch_scales_down_with_its_structure(world):
    """K=16, 256 prompts, minibatch 32 prompts: 8 optimizer steps per RL step at any P."""
    g = smoke.scale_geometry(16, 256, 32 * 16, world, row_tokens=25)
    assert g.num_responses == 16 and g.world_size == world
    assert g.minibatches_per_step == 8 == g.config['minibatches_per_step']
    responses_per_rank = g.prompts_per_rank * g.num_responses
    assert responses_per_rank == g.minibatches_per_step * g.minibatch_responses_per_rank
    assert g.prompts_per_step == g.prompts_per_rank * world < 256
    assert g.minibatch_responses_per_rank >= 16  # several micro-batches, each of several responses
    assert 3 <= g.micro_batches <= 4
    assert g.minibatch_responses_per_rank == g.micro_batches * g.micro_batch_size
    assert g.micro_batch_size >= 4
    # the token budget holds about minibatch / 3.5 full-width rows
    rows = g.max_tokens_per_micro_batch // g.row_tokens
    assert 3 <= -(-g.minibatch_responses_per_rank // rows) <= 4


def test_tiny_cpu_batch_keeps_its_four_minibatches():
    g = smoke.scale_geometry(8, 64, 128, 2, row_tokens=30)
    assert (g.num_responses, g.minibatches_per_step, g.world_size) == (8, 4, 2)
    assert g.prompts_per_rank * 8 == 4 * g.minibatch_responses_per_rank


def test_scaling_refuses_a_minibatch_that_does_not_divide_the_batch():
    with pytest.raises(ValueError, match='does not divide'):
        smoke.scale_geometry(16, 10, 48, 1, row_tokens=20)


@pytest.fixture
def paper_cfg(monkeypatch, tmp_path):
    """configs/clip_cov_intern_s1_mini.py loaded as two processes load it."""
    monkeypatch.setenv('GEPO_MODEL_PATH', str(tmp_path / 'model'))
    monkeypatch.setenv('GEPO_DATA_DIR', str(tmp_path / 'data'))
    monkeypatch.setenv('WORLD_SIZE', '2')
    return Config.fromfile(str(ROOT / 'configs' / 'clip_cov_intern_s1_mini.py'))


def test_smoke_config_swaps_runtime_parts_and_keeps_the_algorithm(paper_cfg):
    g = smoke.scale_geometry(16, 256, 512, 2, row_tokens=25)
    interface = smoke.micro_batch_interface(RLTrainLoop)
    assert interface == 'tokens'
    out = smoke.smoke_config(paper_cfg, model_dir='/m', data_dir='/d', steps=3, geometry=g,
                             interface=interface, max_new_tokens=12)
    loop, orig = out['train_cfg'], paper_cfg.train_cfg
    assert loop['rollout'] == dict(type='HFRolloutBackend')
    assert loop['num_responses'] == orig.num_responses == 16
    assert loop['advantage'] == orig.advantage.to_dict()
    assert loop['rewards'] == orig.rewards.to_dict()
    assert loop['sampling'] == dict(orig.sampling.to_dict(), max_new_tokens=12)
    assert loop['max_tokens_per_micro_batch'] == g.max_tokens_per_micro_batch
    assert loop['minibatch_responses_per_rank'] == g.minibatch_responses_per_rank
    assert loop['max_steps'] == 3
    assert loop['val'] == dict(path='/d/val.jsonl', interval=3)
    assert 'micro_batch_size' not in loop and 'logprob_batch_size' not in loop
    assert out['model']['policy_loss'] == paper_cfg.model.policy_loss.to_dict()
    assert out['model']['pretrained'] == '/m' and out['model']['torch_dtype'] == 'float32'
    assert out['train_dataloader']['batch_size'] == g.prompts_per_rank
    assert out['train_dataloader']['dataset']['path'] == '/d/train.jsonl'
    assert 'accumulative_counts' not in out['optim_wrapper']
    assert out['optim_wrapper']['optimizer'] == paper_cfg.optim_wrapper.optimizer.to_dict()
    assert out['env_cfg']['dist_cfg'] == dict(backend='gloo')
    assert out['model_wrapper_cfg'] == dict(type='MMDistributedDataParallel', device_ids=None,
                                            find_unused_parameters=True)
    assert out['custom_hooks'] == [h.to_dict() for h in paper_cfg.custom_hooks]
    assert out['default_hooks']['checkpoint']['interval'] == 3


def test_old_row_interface_sets_accumulation():
    class RowLoop:  # the signature of the fixed-size micro-batch loop
        def __init__(self, runner, dataloader, micro_batch_size=None, logprob_batch_size=64):
            pass

    g = smoke.scale_geometry(16, 256, 512, 1, row_tokens=25)
    cfg = dict(model=dict(type='RLPolicy', pretrained='x', policy_loss=dict(type='CISPOLoss')),
               train_dataloader=dict(batch_size=256, dataset=dict(path='x')),
               train_cfg=dict(type='RLTrainLoop', rewards=PAPER_REWARDS),
               optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='AdamW')))
    out = smoke.smoke_config(cfg, model_dir='/m', data_dir='/d', steps=1, geometry=g,
                             interface=smoke.micro_batch_interface(RowLoop), max_new_tokens=8)
    assert out['train_cfg']['micro_batch_size'] == g.micro_batch_size
    assert out['optim_wrapper']['accumulative_counts'] == g.micro_batches


@pytest.mark.parametrize('model_type, reason', [
    ('interns1', 'Qwen3'), ('qwen3_5', 'Qwen3'), (None, 'Qwen2')])
def test_family_follows_the_config_model_type(model_type, reason):
    import transformers
    family = smoke.choose_family(model_type)
    assert reason in family.reason
    if model_type is None:
        assert family.name == 'qwen2'
    elif model_type == 'interns1' and hasattr(transformers, 'InternVLForConditionalGeneration'):
        assert family.name == 'internvl' and family.vision  # the Intern-S1-shaped VLM
    else:
        assert not family.vision
        if model_type == 'interns1':  # says why there are no images
            assert 'needs the internvl classes (transformers >= 4.52)' in family.reason
        expected = 'qwen3' if hasattr(transformers, 'Qwen3ForCausalLM') else 'qwen2'
        assert family.name == expected
        assert (expected == 'qwen3') or 'has no Qwen3ForCausalLM' in family.reason
    assert hasattr(transformers, family.model_class)


# ---- records ----

def test_records_follow_the_schema_and_cover_exactly_the_reward_domains():
    kinds = smoke.domains_of(dict(PAPER_REWARDS, default=dict(type='ExactMatchReward')))
    assert kinds['code'] == 'code' and kinds['default'] == 'exact'
    records = smoke.make_records(kinds, 5, seed=3)
    assert sorted({r['domain'] for r in records}) == sorted(kinds)
    assert len(records) == 5 * len(kinds)
    tok = smoke.build_smoke_tokenizer()
    for i, rec in enumerate(records):
        validate_record(json.loads(json.dumps(rec)), f'train.jsonl:{i + 1}')
        assert tok.unk_token_id not in tok(rec['prompt'] + '=')['input_ids']
    assert smoke.make_records(kinds, 5, seed=3) == records  # a function of the seed


def test_tiny_policy_gets_mixed_rewards_from_the_real_verifiers():
    """Random completions of the tiny model: rewards vary inside the groups of every
    answer-checked domain (GRPO advantages are not all zero); checked on fresh samples,
    not those the references were chosen from."""
    kinds = smoke.domains_of(PAPER_REWARDS)
    router = RewardRouter(PAPER_REWARDS)
    tok = smoke.build_smoke_tokenizer()
    model = smoke.build_smoke_model(smoke.choose_family('interns1'), len(tok), seed=1)
    drafts = smoke.make_records(kinds, 12, seed=0)
    records, report = smoke.calibrate_records(
        drafts, kinds, smoke.sample_completions(model, tok, drafts, 16, max_new_tokens=12),
        router.fn_for, keep=6)
    assert len(records) == 6 * len(kinds)
    for rec in records:
        validate_record(rec, 'train.jsonl:1')
    fresh = smoke.sample_completions(model, tok, records, 16, max_new_tokens=12, seed=7)
    rewards, _, _ = router.score([c for group in fresh for c in group],
                                 [r for r in records for _ in range(16)])
    groups = rewards.view(len(records), 16)
    for domain in kinds:
        rows = groups[[i for i, r in enumerate(records) if r['domain'] == domain]]
        mixed = ((rows.min(1).values < rows.max(1).values).float().mean()).item()
        if domain == 'code':
            continue  # random text is rarely a program; code may always score 0
        assert report[domain]['mixed_groups'] >= 0.5, (domain, report)
        assert mixed >= 0.5, (domain, mixed, report)


def test_smoke_model_has_peaked_distributions():
    """Sampled-token logprobs spread over several nats (Clip-Cov's covariance bound 1)."""
    import torch
    tok = smoke.build_smoke_tokenizer()
    model = smoke.build_smoke_model(smoke.choose_family('qwen3_5'), len(tok), seed=1)
    ids = torch.randint(4, len(tok), (32, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits, -1)
    top = logp.max(-1).values
    assert top.mean() > -1.0  # a clear favourite at most positions
    assert (logp.exp() * logp).sum(-1).neg().mean() < 0.7 * math.log(len(tok))
    assert logp.min() < -8  # and tokens several nats below it


def test_prepared_model_and_records_from_the_cache_equal_fresh_ones(tmp_path):
    """A cache hit gives the files a fresh preparation writes, byte for byte; an input
    that decides them (K) is a new entry, what does not (the algorithm) is not."""
    def cfg(k: int = 4, loss: str = 'CISPOLoss') -> dict:
        return dict(model=dict(type='RLPolicy', pretrained='x', policy_loss=dict(type=loss)),
                    train_dataloader=dict(batch_size=4, dataset=dict(path='x')),
                    train_cfg=dict(type='RLTrainLoop', num_responses=k,
                                   minibatch_responses_per_rank=2 * k,
                                   rewards=dict(math=dict(type='MathReward'),
                                                default=dict(type='ExactMatchReward'))),
                    optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='AdamW')))

    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob('*'))
                if p.is_file() and p.parts[len(root.parts)] in ('model', 'data')}

    args = dict(steps=1, world_size=1, seeds=range(2), max_new_tokens=4)
    cache = tmp_path / 'cache'
    fresh = smoke.prepare_smoke_run(cfg(), tmp_path / 'fresh', **args)
    first = smoke.prepare_smoke_run(cfg(), tmp_path / 'first', cache_dir=cache, **args)
    hit = smoke.prepare_smoke_run(cfg(loss='GRPOLoss'), tmp_path / 'hit', cache_dir=cache,
                                  **args)
    other = smoke.prepare_smoke_run(cfg(k=2), tmp_path / 'other', cache_dir=cache, **args)
    assert (fresh.cached, first.cached, hit.cached, other.cached) == (False, False, True, False)
    assert len(list(cache.iterdir())) == 2
    assert files(tmp_path / 'hit') == files(tmp_path / 'first') == files(tmp_path / 'fresh')
    assert len(files(tmp_path / 'hit')) >= 4  # weights, tokenizer, train and val records
    assert (hit.seed, hit.rewards) == (fresh.seed, fresh.rewards)
    assert (hit.geometry, hit.family) == (fresh.geometry, fresh.family)
    assert Config.fromfile(str(hit.config_path)).model.policy_loss.type == 'GRPOLoss'


# ---- real runs through xtuner's training program ----


@pytest.fixture(scope='module', autouse=True)
def smoke_cache(tmp_path_factory):
    """The module's smoke runs share prepared models and records where their inputs agree
    (``--smoke-cache``, here through ``GEPO_SMOKE_CACHE``), as a user checking several
    algorithms of one mixture would; the cache itself is checked above."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv('GEPO_SMOKE_CACHE', str(tmp_path_factory.mktemp('smoke_cache')))
        yield

def run_smoke(config: str, *extra: str, steps: int = 2, nproc: int = 2,
              timeout: int = 400) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ('GEPO_MODEL_PATH', 'GEPO_DATA_DIR', 'WORLD_SIZE', 'SLURM_NTASKS')}
    return preloaded.run([sys.executable, str(TOOL), str(ROOT / 'configs' / config),
                          '--smoke-steps', str(steps), '--nproc', str(nproc), *extra],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                         check=False)


def passed(proc: subprocess.CompletedProcess, steps: int = 2) -> dict:
    """The last step's metrics of a run that must have passed."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last['step'] == steps
    assert 'HFRolloutBackend' in proc.stdout and 'model family' in proc.stdout
    return last


def all_steps(work_dir: Path) -> dict[int, dict[str, float]]:
    metrics = smoke.step_metrics(work_dir / 'run')
    return {s: m for s, m in metrics.items() if s > 0}


def test_clip_cov_selects_tokens_on_every_step(tmp_path):
    proc = run_smoke('clip_cov_intern_s1_mini.py', '--work-dir', str(tmp_path))
    last = passed(proc)
    steps = all_steps(tmp_path)
    assert sorted(steps) == [1, 2]
    for step, row in steps.items():
        assert row['loss/cov_tokens'] > 0, (step, row)  # Clip-Cov detached tokens
        assert row['adv/abs_mean'] > 0 and row['optim/steps'] == 8, (step, row)
        assert row['optim/micro_batches'] >= 3, (step, row)
    assert last['loss/cov_tokens'] == steps[2]['loss/cov_tokens']
    assert (tmp_path / 'run' / 'iter_2.pth').exists()


def test_kl_cov_penalises_tokens_of_a_real_covariance(tmp_path):
    passed(run_smoke('kl_cov_intern_s1_mini.py', '--work-dir', str(tmp_path)))
    for step, row in all_steps(tmp_path).items():
        assert row['loss/cov_tokens'] > 0 and row['adv/abs_mean'] > 0, (step, row)
        if 'loss/cov_abs_mean' in row:
            assert row['loss/cov_abs_mean'] > 0, (step, row)
        assert row['loss/kl_cov_penalty'] > 0, (step, row)  # the policy moved off the old one


@pytest.mark.parametrize('config', ['gepo_intern_s1_mini.py', 'aepo_intern_s1_mini.py'])
def test_entropy_methods_run(config):
    last = passed(run_smoke(config))
    # 8 optimizer steps, fewer (of full size) on a step where AEPO's gate removed rows
    assert last['adv/abs_mean'] > 0 and last['optim/steps'] <= 8
    assert last['optim/steps'] == 8 or last['shaping/frac_removed'] > 0
    assert math.isfinite(last['loss/pg']) and 'val/acc' in last


def test_a_failing_run_exits_non_zero_with_the_log_tail():
    proc = run_smoke('grpo_intern_s1_mini.py', '--cfg-options',
                     'model.policy_loss.eps_high=-1', steps=1, nproc=1)
    assert proc.returncode == 1
    assert 'smoke run FAILED' in proc.stderr and 'eps_high' in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize('config', SHIPPED)
def test_every_shipped_config_passes_a_two_process_smoke_run(config):
    last = passed(run_smoke(config))
    assert last['optim/steps'] >= 1 and math.isfinite(last['loss/pg'])


@pytest.mark.parametrize('world,steps', [(1, 1), (2, 3), (4, 5)])
def test_records_cover_every_step_of_the_run(tmp_path, monkeypatch, world, steps):
    """Each rank draws full batches on every step: no step trains on the tail of an epoch.
    (A floor of one record per domain, so the count comes from the geometry alone; the
    records file holds this many per domain, ``test_prepared_model_and_records_...`` and
    every run above read it.)"""
    for key, value in dict(WORLD_SIZE=str(world), GEPO_MODEL_PATH=str(tmp_path / 'model'),
                           GEPO_DATA_DIR=str(tmp_path / 'data')).items():
        monkeypatch.setenv(key, value)  # as check_config.py sets them
    cfg = Config.fromfile(str(ROOT / 'configs' / 'gepo_intern_s1_mini.py'))
    loop = cfg.train_cfg
    per_domain = smoke.train_records_per_domain(cfg, steps=steps, world_size=world, n_train=1)
    geometry = smoke.scale_geometry(
        int(loop.num_responses), int(cfg.train_dataloader.batch_size) * world,
        int(loop.minibatch_responses_per_rank) * world, world, 1)
    records = per_domain * len(smoke.domains_of(loop.rewards))
    assert per_domain > 1 and records >= geometry.prompts_per_step * steps
    # and no more than the last domain's share needs
    assert (per_domain - 1) * len(smoke.domains_of(loop.rewards)) < geometry.prompts_per_step * steps


def test_intern_s1_configs_train_the_intern_s1_shaped_vlm_on_images(tf5_deps, tmp_path):
    """With transformers 5 (the overlay), the paper config in miniature on 2 ranks: image
    records (1, 3 and 5 tiles) beside text records, HF rollouts scored on the same image
    context, and the vision tower, its projector and the language model all updated."""
    import torch
    from safetensors.torch import load_file

    env = {k: v for k, v in os.environ.items()
           if k not in ('GEPO_MODEL_PATH', 'GEPO_DATA_DIR', 'WORLD_SIZE', 'SLURM_NTASKS')}
    env['PYTHONPATH'] = os.pathsep.join([str(tf5_deps), str(ROOT)])
    proc = preloaded.run([sys.executable, str(TOOL), str(ROOT / 'configs' / 'gepo_intern_s1_mini.py'),
                          '--smoke-steps', '2', '--nproc', '2', '--work-dir', str(tmp_path)],
                         cwd=ROOT, env=env, timeout=600)
    last = passed(proc)
    assert 'internvl (InternVLForConditionalGeneration)' in proc.stdout
    assert 'image records of 1, 3 and 5 tiles' in proc.stdout
    records = [json.loads(line) for line in (tmp_path / 'data' / 'train.jsonl').open()]
    pictured = [r for r in records if r.get('images')]
    assert 0 < len(pictured) < len(records)
    assert all(r['prompt'].startswith('<IMG_CONTEXT>') for r in pictured)
    assert last['rollout/logprob_abs_diff'] < 1e-4  # trainer and sampler saw one context
    before = load_file(str(tmp_path / 'model' / 'model.safetensors'))
    after = torch.load(tmp_path / 'run' / 'iter_2.pth', map_location='cpu',
                       weights_only=False)['state_dict']
    pairs = {'vision_tower.encoder.layer.0.attention.q_proj.weight':
             'llm.model.vision_tower.encoder.layer.0.attention.q_proj.weight',
             'multi_modal_projector.linear_1.weight': 'llm.model.multi_modal_projector.linear_1.weight',
             'language_model.model.layers.1.mlp.up_proj.weight':
             'llm.model.language_model.layers.1.mlp.up_proj.weight'}
    for disk, trained in pairs.items():
        assert not torch.equal(before[disk], after[trained]), disk
