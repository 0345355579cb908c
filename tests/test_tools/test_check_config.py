"""``tools/check_config.py`` over every shipped config, and the paper configs' values.

The checker runs as a real subprocess, as a user runs it before a cluster job. Model and
data locations are temporary directories with the files the checks look at (a
``config.json``, JSONL files): no weights, nothing downloaded.
"""

import json
import sys
from pathlib import Path

import pytest
from mmengine.config import Config

import gepo_xtuner  # noqa: F401  (registers the types the configs name)
from gepo_xtuner.registry import ADVANTAGES, REWARDS, ROLLOUT_BACKENDS
from tests import preloaded

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / 'tools' / 'check_config.py'
SHIPPED = sorted(p for p in (ROOT / 'configs').glob('*.py'))
MODELS = ('intern_s1_mini', 'qwen3_5_9b')
ALGORITHMS = ('gepo', 'grpo', 'aepo', 'clip_cov', 'kl_cov', 'gepo_wo_low', 'gepo_wo_high',
              'gepo_symmetric')
PAPER = [ROOT / 'configs' / f'{algo}_{model}.py' for model in MODELS for algo in ALGORITHMS]
GEPO = dict(alpha_low=0.5, alpha_high=0.2, beta_low=0.2, beta_high=0.3, gamma=0.01)
REWARD_TYPES = dict(math='MathReward', physics='NumericReward', science='MultipleChoiceReward',
                    code='CodeReward', instruction='InstructionFollowingReward',
                    chart='ChartQAReward')
# Names the paper configs use that another part of the package provides; until a name is
# registered, the checker must report it as unresolved (and nothing else).
MISSING = sorted({name for name in REWARD_TYPES.values() if REWARDS.get(name) is None}
                 | {name for name in ['LMDeployRolloutBackend']
                    if ROLLOUT_BACKENDS.get(name) is None})


@pytest.fixture
def locations(tmp_path):
    """Environment variables pointing at a model directory and data files that exist."""
    model = tmp_path / 'Intern-S1-mini'
    model.mkdir()
    (model / 'config.json').write_text(json.dumps(dict(model_type='interns1')))
    data = tmp_path / 'data'
    data.mkdir()
    for split in ('train', 'val'):
        (data / f'{split}.jsonl').write_text(
            '{"prompt": "1+1=", "domain": "math", "answer": "2"}\n')
    tiny = tmp_path / 'tiny'
    (tiny / 'model').mkdir(parents=True)
    (tiny / 'model' / 'config.json').write_text(json.dumps(dict(model_type='qwen2')))
    (tiny / 'data').symlink_to(data)
    smollm2 = tmp_path / 'smollm2'  # tools/prepare_smollm2.py's layout, one record per file
    (smollm2 / 'model').mkdir(parents=True)
    (smollm2 / 'model' / 'config.json').write_text(json.dumps(dict(model_type='llama')))
    (smollm2 / 'data').mkdir()
    records = dict(
        gsm8k={'question': 'What is 2 + 3?', 'answer': '2 + 3 = 5\n#### 5'},
        instructions={'domain': 'instruction', 'prompt': 'Say hi without commas.',
                      'instructions': [{'id': 'punctuation:no_comma', 'kwargs': {}}]},
        code={'domain': 'code', 'prompt': 'Echo the input.',
              'tests': [{'input': 'a\n', 'output': 'a\n'}]})
    for name, record in records.items():
        for split in ('train', 'val'):
            (smollm2 / 'data' / f'{name}_{split}.jsonl').write_text(json.dumps(record) + '\n')
    return dict(GEPO_MODEL_PATH=str(model), GEPO_DATA_DIR=str(data), GEPO_TINY_DIR=str(tiny),
                GEPO_SMOLLM2_DIR=str(smollm2))


# The paper's policies (Intern-S1-mini: transformers >= 4.53; Qwen3.5: 5) load only with the
# transformers-5 overlay first on the path, and the checker refuses them without it: its
# runs here have the overlay unless a test asks for the pinned environment (overlay=False).
OVERLAY: list[str] = []


@pytest.fixture(autouse=True, scope='module')
def _transformers5(tf5_deps):
    OVERLAY[:] = [str(tf5_deps)]


def check(*args, env: dict[str, str] | None = None, unset=('GEPO_MODEL_PATH', 'GEPO_DATA_DIR',
                                                           'WORLD_SIZE', 'SLURM_NTASKS'),
          overlay: bool = True):
    import os
    full = {k: v for k, v in os.environ.items() if k not in unset}
    full.update(env or {}, OMP_NUM_THREADS='1')
    if overlay:
        full['PYTHONPATH'] = os.pathsep.join([*OVERLAY, *filter(None, [full.get('PYTHONPATH')])])
    return preloaded.run([sys.executable, str(TOOL), *map(str, args)], cwd=ROOT, env=full,
                         capture_output=True, text=True, timeout=300, check=False)


def test_every_shipped_config_passes_the_checker(locations):
    """All configs under configs/ (not _base_), in one run, at the world size of one node.

    A type the installed package does not register (see MISSING) must be reported as
    ``unresolved type`` and be the only problem; once all are registered, exit status 0.
    """
    assert len(SHIPPED) >= len(PAPER) + 2 and set(PAPER) <= set(SHIPPED)
    # each paper model's configs with a checkpoint of that model (another is refused)
    qwen = Path(locations['GEPO_MODEL_PATH']).with_name('Qwen3.5-9B')
    qwen.mkdir()
    (qwen / 'config.json').write_text(json.dumps(dict(model_type='qwen3_5')))
    rest = [p for p in SHIPPED if not p.name.endswith('_qwen3_5_9b.py')]
    proc = check(*rest, '--world-size', '8', '--json', env=locations)
    second = check(*sorted(set(SHIPPED) - set(rest)), '--world-size', '8', '--json',
                   env=dict(locations, GEPO_MODEL_PATH=str(qwen)))
    reports = {Path(r['config']).name: r
               for r in json.loads(proc.stdout) + json.loads(second.stdout)}
    assert second.returncode == proc.returncode
    assert sorted(reports) == sorted(p.name for p in SHIPPED)
    for name, report in reports.items():
        unresolved = [p for p in report['problems'] if 'unresolved type' in p]
        assert unresolved == report['problems'], (name, report['problems'])
        assert all(any(f"'{m}'" in p for m in MISSING) for p in unresolved), unresolved
        assert 'world size' in report['rows'], (name, report['rows'])
    paper = [reports[p.name] for p in PAPER]
    if MISSING:
        assert proc.returncode == 1 and all(r['problems'] for r in paper)
        assert 'unresolved type' in proc.stderr  # the reason, not a traceback
    else:
        assert proc.returncode == 0, proc.stderr
        assert all(r['rows']['rewards'] for r in paper)
    for report in paper:
        rows = report['rows']
        assert rows['K (responses per prompt)'] == '16'
        assert rows['prompts per RL step'] == '32 per rank x 8 = 256'
        assert rows['minibatch'] == ('64 responses per rank x 8 = 512 responses '
                                     '(= 32 prompts)')
        assert rows['optimizer steps per RL step'] == '8 (ppo_epochs 1)'
        assert rows['sampling'].startswith('temperature 1.0, top_p 1.0, top_k 0')
        assert rows['rollout'].startswith('LMDeployRolloutBackend')
        assert rows['dtype'] == 'bfloat16' and '--deepspeed deepspeed_zero2' in rows['runner']


def test_the_pinned_environment_refuses_the_paper_models(locations, tmp_path):
    """Without the overlay (transformers 4.48, xtuner's pin) neither paper policy loads: the
    checker says so with the version and the fix, for each config, instead of a run that
    fails minutes into the job."""
    proc = check(ROOT / 'configs' / 'gepo_intern_s1_mini.py', ROOT / 'configs' /
                 'grpo_qwen3_5_9b.py', '--world-size', '8', env=locations, overlay=False)
    assert proc.returncode == 1
    assert ("gepo_intern_s1_mini.py: model: model_type 'interns1' (Intern-S1) needs "
            'transformers >= 4.53, and this environment has 4.48') in proc.stderr
    assert "grpo_qwen3_5_9b.py: model: model_type 'interns1'" in proc.stderr  # its config.json
    assert 'make tf5-deps' in proc.stderr
    qwen = tmp_path / 'qwen'
    qwen.mkdir()
    (qwen / 'config.json').write_text(json.dumps(dict(model_type='qwen3_5')))
    proc = check(ROOT / 'configs' / 'grpo_qwen3_5_9b.py', '--world-size', '8',
                 env=dict(locations, GEPO_MODEL_PATH=str(qwen)), overlay=False)
    assert "model_type 'qwen3_5' (Qwen3.5) needs transformers >= 5.0" in proc.stderr
    proc = check(ROOT / 'configs' / 'grpo_qwen3_5_9b.py', '--world-size', '8',
                 env=dict(locations, GEPO_MODEL_PATH=str(qwen)))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_policy_missing_what_loading_needs_is_refused(locations):
    """Intern-S1's own code without trust_remote_code, and without its processor: each
    named with the key to set."""
    config = json.loads((Path(locations['GEPO_MODEL_PATH']) / 'config.json').read_text())
    (Path(locations['GEPO_MODEL_PATH']) / 'config.json').write_text(
        json.dumps(dict(config, auto_map={'AutoConfig': 'configuration_interns1.InternS1Config'})))
    proc = check(ROOT / 'configs' / 'gepo_intern_s1_mini.py', '--world-size', '8',
                 '--cfg-options', 'model.trust_remote_code=False', 'model.processor=',
                 env=locations)
    assert proc.returncode == 1
    assert 'set model.trust_remote_code=True' in proc.stdout
    assert 'set model.processor (the checkpoint directory)' in proc.stdout
    proc = check(ROOT / 'configs' / 'gepo_intern_s1_mini.py', '--world-size', '8', env=locations)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ('loading                      AutoModelForCausalLM, processor '
            f'{locations["GEPO_MODEL_PATH"]}, trust_remote_code (transformers 5.') in proc.stdout


def test_report_is_a_readable_table(locations):
    proc = check(ROOT / 'configs' / 'gepo_intern_s1_mini.py', '--world-size', '8', env=locations)
    out = proc.stdout
    assert 'config variables' in out and 'what would run' in out
    assert f'GEPO_MODEL_PATH        {locations["GEPO_MODEL_PATH"]}  (environment)' in out
    assert ('algorithm                    GEPOAdvantage alpha_low=0.5 alpha_high=0.2 '
            'beta_low=0.2 beta_high=0.3 gamma=0.01 eps=1e-08') in out
    assert ("policy loss                  CISPOLoss eps_low=1.0 eps_high=4.0 "
            "agg='token-mean'") in out
    assert f'Intern-S1-mini: {locations["GEPO_MODEL_PATH"]} [model_type interns1]' in out
    assert 'world size                   8 (--world-size)' in out


def load(path: Path, monkeypatch, world_size: int = 8, **env: str):
    monkeypatch.setenv('GEPO_MODEL_PATH', env.get('GEPO_MODEL_PATH', '/models/m'))
    monkeypatch.setenv('GEPO_DATA_DIR', env.get('GEPO_DATA_DIR', '/data'))
    monkeypatch.setenv('WORLD_SIZE', str(world_size))
    monkeypatch.delenv('SLURM_NTASKS', raising=False)
    return Config.fromfile(str(path))


def algorithm_base(name: str) -> Config:
    return Config.fromfile(str(ROOT / 'configs' / '_base_' / 'algorithms' / f'{name}.py'))


@pytest.mark.parametrize('path', PAPER, ids=lambda p: p.stem)
def test_paper_settings_section_3_1(path, monkeypatch):
    cfg = load(path, monkeypatch)
    loop = cfg.train_cfg
    assert loop.num_responses == 16  # "sample 16 responses per prompt"
    assert loop.sampling.temperature == 1.0 and loop.sampling.top_p == 1.0
    assert loop.sampling.top_k == 0
    assert cfg.train_dataloader.batch_size * 8 == 256  # "batch size of 256" (prompts)
    assert loop.minibatch_responses_per_rank * 8 == 32 * 16  # "minibatch size of 32" (prompts)
    assert 'accumulative_counts' not in cfg.optim_wrapper  # the loop accumulates
    assert loop.max_tokens_per_micro_batch in (20480, 30720)
    assert cfg.model.torch_dtype == 'bfloat16'
    assert loop.rollout.type == 'LMDeployRolloutBackend'
    assert loop.rollout.weight_sync == dict(mode='ipc')
    assert loop.rollout.launch.model_path == '/models/m'
    assert {d: r.type for d, r in loop.rewards.items()} == REWARD_TYPES
    assert loop.val.path == '/data/val.jsonl'
    assert cfg.train_dataloader.dataset.path == '/data/train.jsonl'
    assert cfg.custom_imports == dict(imports=['gepo_xtuner'], allow_failed_imports=False)
    # CISPO importance-weight clipping for every method, as the paper applied it
    loss = cfg.model.policy_loss
    assert loss.type == 'CISPOLoss' or loss.importance == 'cispo'
    assert (loss.eps_low, loss.eps_high) == (1.0, 4.0)


@pytest.mark.parametrize('model', MODELS)
def test_gepo_and_its_ablations(model, monkeypatch):
    def advantage(algo):
        cfg = load(ROOT / 'configs' / f'{algo}_{model}.py', monkeypatch).train_cfg.advantage
        assert cfg.type == 'GEPOAdvantage'
        proc = ADVANTAGES.build(dict(cfg))
        return {name: getattr(proc, name) for name in GEPO}

    assert advantage('gepo') == GEPO  # alpha_high .2, alpha_low .5, beta_high .3, beta_low .2
    assert advantage('gepo_wo_low') == {**GEPO, 'alpha_low': 1.0}
    assert advantage('gepo_wo_high') == {**GEPO, 'alpha_high': 1.0}
    symmetric = advantage('gepo_symmetric')
    assert symmetric == {**GEPO, 'alpha_low': 0.2} and symmetric['alpha_low'] == 0.2


@pytest.mark.parametrize('model', MODELS)
@pytest.mark.parametrize('algo', ['gepo', 'grpo', 'aepo', 'clip_cov', 'kl_cov', 'gepo_wo_low',
                                  'gepo_wo_high', 'gepo_symmetric'])
def test_methods_come_from_the_algorithm_bases(algo, model, monkeypatch):
    """One source of truth: configs/_base_/algorithms/<algo>.py."""
    cfg = load(ROOT / 'configs' / f'{algo}_{model}.py', monkeypatch)
    base = algorithm_base(algo)
    assert cfg.train_cfg.advantage == base.advantage
    assert cfg.model.policy_loss == base.policy_loss


def test_baselines_use_the_authors_qwen2_5_7b_parameters(monkeypatch):
    clip = load(ROOT / 'configs' / 'clip_cov_intern_s1_mini.py', monkeypatch).model.policy_loss
    assert (clip.type, clip.clip_cov_ratio, clip.clip_cov_lb, clip.clip_cov_ub) == (
        'ClipCovLoss', 2e-4, 1.0, 5.0)
    kl = load(ROOT / 'configs' / 'kl_cov_qwen3_5_9b.py', monkeypatch).model.policy_loss
    assert (kl.type, kl.kl_cov_ratio, kl.ppo_kl_coef) == ('KLCovLoss', 0.002, 1.0)


@pytest.mark.parametrize('world_size', [1, 2, 8, 16, 64])
def test_global_batch_is_256_prompts_at_any_world_size(world_size, monkeypatch):
    cfg = load(ROOT / 'configs' / 'gepo_intern_s1_mini.py', monkeypatch, world_size)
    assert cfg.train_dataloader.batch_size * world_size == 256
    assert cfg.train_cfg.minibatch_responses_per_rank * world_size == 512


def test_a_world_size_that_cannot_split_the_batch_is_refused(locations):
    proc = check(ROOT / 'configs' / 'grpo_qwen3_5_9b.py', '--world-size', '3', env=locations)
    assert proc.returncode == 1
    assert ('3 training processes cannot split the batch evenly: prompts per RL step should be '
            '256 over all ranks') in proc.stdout


def test_unset_model_path_names_the_variable(locations, monkeypatch):
    env = {k: v for k, v in locations.items() if k != 'GEPO_MODEL_PATH'}
    proc = check(ROOT / 'configs' / 'gepo_qwen3_5_9b.py', env=env)
    assert proc.returncode == 1
    assert 'environment variable GEPO_MODEL_PATH is not set' in proc.stdout
    assert 'export GEPO_MODEL_PATH=...' in proc.stdout
    # `xtuner train` loads the config the same way: mmengine's error names it too
    monkeypatch.delenv('GEPO_MODEL_PATH', raising=False)
    monkeypatch.setenv('GEPO_DATA_DIR', '/data')
    with pytest.raises(KeyError, match='GEPO_MODEL_PATH'):
        Config.fromfile(str(ROOT / 'configs' / 'gepo_qwen3_5_9b.py'))


def test_missing_paths_name_the_variable_to_fix(locations, tmp_path):
    env = dict(locations, GEPO_MODEL_PATH=str(tmp_path / 'nope'),
               GEPO_DATA_DIR=str(tmp_path / 'nodata'))
    proc = check(ROOT / 'configs' / 'gepo_intern_s1_mini.py', env=env)
    assert proc.returncode == 1
    assert (f'model directory {tmp_path / "nope"} does not exist (from GEPO_MODEL_PATH: set '
            'GEPO_MODEL_PATH to the right location)') in proc.stdout
    assert f'file {tmp_path / "nodata" / "train.jsonl"} does not exist (from GEPO_DATA_DIR' \
        in proc.stdout
    proc = check(ROOT / 'configs' / 'gepo_intern_s1_mini.py', '--no-path-check', env=env)
    assert 'does not exist' not in proc.stdout


def test_a_model_directory_of_the_other_model_warns(locations):
    proc = check(ROOT / 'configs' / 'grpo_qwen3_5_9b.py', env=locations)
    assert ("says model_type 'interns1', but this config is for Qwen3.5-9B ('qwen3_5')"
            in proc.stdout)


def test_a_bad_hyperparameter_fails_with_the_processors_message(locations):
    proc = check(ROOT / 'configs' / 'gepo_tiny_cpu.py', '--cfg-options',
                 'train_cfg.advantage.alpha_low=1.5', env=locations)
    assert proc.returncode == 1
    assert 'train_cfg.advantage: ValueError:' in proc.stdout and 'alpha_low' in proc.stdout
    assert 'gepo_tiny_cpu.py: train_cfg.advantage' in proc.stderr  # CONFIG: problem


def test_wrapper_accumulation_and_fixed_micro_batches_are_refused(locations):
    proc = check(ROOT / 'configs' / 'gepo_intern_s1_mini.py', '--world-size', '8',
                 '--cfg-options', 'train_cfg.micro_batch_size=4',
                 'optim_wrapper.accumulative_counts=16', env=locations)
    assert ('optim_wrapper.accumulative_counts: is 16: the RL loop accumulates gradients '
            'itself') in proc.stdout
    assert "train_cfg: TypeError: got an unexpected keyword argument 'micro_batch_size'" in (
        proc.stdout)


def test_a_renamed_key_is_named_with_its_new_name(locations):
    proc = check(ROOT / 'configs' / 'gepo_tiny_cpu.py', '--cfg-options',
                 'train_cfg.minibatch_size=8', env=locations)
    assert proc.returncode == 1
    assert ("train_cfg: TypeError: got an unexpected keyword argument 'minibatch_size' "
            '(train_cfg.minibatch_size was renamed: use train_cfg.minibatch_responses_per_rank)'
            ) in proc.stdout


def test_a_misspelt_argument_is_named(locations, tmp_path):
    cfg = tmp_path / 'typo.py'
    cfg.write_text(f"_base_ = ['{ROOT / 'configs' / 'grpo_tiny_cpu.py'}']\n"
                   "train_cfg = dict(num_response=16)\n"
                   "model = dict(torch_dtype='bf16')\n")
    proc = check(cfg, env=locations)
    assert proc.returncode == 1
    assert ("train_cfg: TypeError: got an unexpected keyword argument 'num_response' (did "
            'you mean train_cfg.num_responses?)') in proc.stdout
    assert "model: ValueError: model.torch_dtype 'bf16' is not a torch dtype" in proc.stdout


def test_a_config_that_does_not_parse_gives_file_and_line(tmp_path):
    cfg = tmp_path / 'broken.py'
    cfg.write_text("model = dict(\n    type='RLPolicy',\n    pretrained=/x,\n)\n")
    proc = check(cfg, tmp_path / 'absent.py')
    assert proc.returncode == 1
    assert 'cannot read: SyntaxError' in proc.stdout and 'broken.py, line 3' in proc.stdout
    assert f'{tmp_path / "absent.py"}: no such file' in proc.stderr
    assert '2 of 2 configs FAILED' in proc.stderr


def test_launch_mode_config_builds_the_real_backend(monkeypatch):
    """Default: training rank 0 launches the server; weights by CUDA IPC. Nothing starts."""
    monkeypatch.delenv('GEPO_LMDEPLOY_URL', raising=False)
    monkeypatch.setenv('GEPO_LMDEPLOY_PYTHON', '/opt/lmdeploy/bin/python')
    monkeypatch.setenv('MASTER_ADDR', 'node1')
    rollout = load(ROOT / 'configs' / 'gepo_intern_s1_mini.py', monkeypatch).train_cfg.rollout
    assert rollout.launch == dict(model_path='/models/m', host='node1', port=23333,
                                  backend='pytorch', tp=1, python='/opt/lmdeploy/bin/python')
    assert rollout.weight_sync == dict(mode='ipc') and rollout.sleep_wake is True
    backend = ROLLOUT_BACKENDS.build(rollout)  # the backend's own argument checks pass
    assert backend.url == 'http://node1:23333'
    backend.close()


def test_a_separate_server_gets_weights_over_nccl(monkeypatch, locations):
    monkeypatch.setenv('GEPO_LMDEPLOY_URL', 'http://node7:23333')
    monkeypatch.setenv('GEPO_LMDEPLOY_TP', '2')
    monkeypatch.setenv('MASTER_ADDR', 'node1')
    rollout = load(ROOT / 'configs' / 'kl_cov_qwen3_5_9b.py', monkeypatch).train_cfg.rollout
    assert rollout.server_url == 'http://node7:23333' and 'launch' not in rollout
    assert rollout.weight_sync == dict(mode='nccl', master_address='node1', master_port=29600,
                                       server_tp=2)
    ROLLOUT_BACKENDS.build(rollout).close()
    # on the login node MASTER_ADDR is unset: the checker warns that the server cannot reach it
    proc = check(ROOT / 'configs' / 'kl_cov_qwen3_5_9b.py',
                 env=dict(locations, GEPO_LMDEPLOY_URL='http://node7:23333'),
                 unset=('MASTER_ADDR', 'WORLD_SIZE', 'SLURM_NTASKS'))
    assert ("the server at http://node7:23333 must reach training rank 0 at master_address "
            "'127.0.0.1'") in proc.stdout


def test_hub_ids_are_reported_and_relative_paths_checked(locations):
    proc = check(ROOT / 'configs' / 'gepo_tiny_cpu.py', '--cfg-options',
                 'model.pretrained=Qwen/Qwen2.5-7B', 'model.tokenizer=./nothere', env=locations)
    assert 'Qwen/Qwen2.5-7B [hub id: downloaded at build time, not checked]' in proc.stdout
    assert 'model.tokenizer: model directory ./nothere does not exist' in proc.stdout


def test_validation_benchmarks_are_checked(locations, tmp_path):
    data = locations['GEPO_DATA_DIR']
    cfg = tmp_path / 'bench.py'
    cfg.write_text(f"_base_ = ['{ROOT / 'configs' / 'gepo_tiny_cpu.py'}']\n"
                   "train_cfg = dict(val=dict(_delete_=True, interval=5, benchmarks=[\n"
                   f"    dict(name='aime', path='{data}/val.jsonl'),\n"
                   f"    dict(name='gpqa', path='{tmp_path}/absent.jsonl', temp=0.6)]))\n")
    proc = check(cfg, env=locations)
    assert proc.returncode == 1
    assert 'train_cfg.val.path' not in proc.stdout  # benchmarks alone are a valid form
    assert "train_cfg: ValueError: val.benchmarks[1] does not take ['temp']" in proc.stdout
    assert f'{tmp_path}/absent.jsonl does not exist' in proc.stdout
    assert 'train_cfg.val.benchmarks[0]' not in proc.stdout


def test_one_response_per_prompt_is_a_problem(locations):
    proc = check(ROOT / 'configs' / 'gepo_intern_s1_mini.py', '--world-size', '8',
                 '--cfg-options', 'train_cfg.num_responses=1', env=locations)
    assert ('train_cfg.num_responses is 1, but GEPOAdvantage compares each response'
            in proc.stdout)
    assert proc.returncode == 1


def test_data_files_are_checked_as_the_dataset_reads_them(locations, tmp_path):
    """GSM8K as published, mapped by the dataset's fields/default_domain; bad lines named."""
    data = tmp_path / 'gsm8k.jsonl'
    rows = [{'question': 'What is 2 + 2?', 'answer': 'Two and two.\n#### 4'},
            {'question': 'What is 3 + 3?', 'answer': 'Three and three.\n#### 6'}]
    data.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    dataset = ("train_dataloader = dict(dataset=dict(_delete_=True, type='PromptDataset', "
               f"path='{data}', required=['answer']"'{}))\n')
    cfg = tmp_path / 'gsm8k.py'
    cfg.write_text(f"_base_ = ['{ROOT / 'configs' / 'gepo_tiny_cpu.py'}']\n"
                   + dataset.format(", fields=dict(prompt='question'), default_domain='math'"))
    proc = check(cfg, env=locations)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f'{data} [exists, 0.0 MiB], 2 records checked' in proc.stdout
    cfg.write_text(f"_base_ = ['{ROOT / 'configs' / 'gepo_tiny_cpu.py'}']\n"
                   + dataset.format(''))  # without the mapping: every record is bad
    proc = check(cfg, env=locations)
    assert proc.returncode == 1
    for line in (1, 2):
        assert (f"train_dataloader.dataset: {data}:{line}: field 'prompt': missing"
                in proc.stdout)
        assert f"train_dataloader.dataset: {data}:{line}: field 'domain': missing" in proc.stdout
    data.write_text('{"question": "x"}\n{"question": \n')
    cfg.write_text(f"_base_ = ['{ROOT / 'configs' / 'gepo_tiny_cpu.py'}']\n"
                   + dataset.format(", fields=dict(prompt='question'), default_domain='math'"))
    proc = check(cfg, env=locations)
    assert f"{data}:1: field 'answer': missing; this dataset requires ['answer']" in proc.stdout
    assert f'{data}:2: not valid JSON' in proc.stdout


def test_chat_parquet_needs_the_tokenizers_chat_template(locations, tmp_path):
    """Chat records as published (``messages``) in Parquet, and a policy whose tokenizer
    has no chat template: refused before step 1, naming file, row and the fix."""
    import pandas as pd
    data = tmp_path / 'chat.parquet'
    pd.DataFrame([{'messages': [{'role': 'user', 'content': 'What is 2 + 2?'}],
                   'domain': 'math', 'answer': '4'}] * 2).to_parquet(data)
    cfg = tmp_path / 'chat.py'
    cfg.write_text(f"_base_ = ['{ROOT / 'configs' / 'gepo_tiny_cpu.py'}']\n"
                   "train_dataloader = dict(dataset=dict(_delete_=True, type='PromptDataset', "
                   f"path='{data}'))\n")
    model = Path(locations['GEPO_TINY_DIR']) / 'model'
    proc = check(cfg, env=locations)
    assert proc.returncode == 1
    assert (f"train_dataloader.dataset: {data}:row 1: field 'messages': chat turns need a chat "
            f'template, and {model} has none; use the chat model\'s tokenizer') in proc.stdout
    (model / 'tokenizer_config.json').write_text(json.dumps(dict(
        chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")))
    proc = check(cfg, env=locations)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f'{data} [exists, 0.0 MiB], 2 records checked' in proc.stdout


def test_generation_ahead_is_checked_against_the_backend(monkeypatch, locations):
    """The paper config's default (the colocated server, asleep while the trainer updates)
    cannot overlap; with a separate server it can; only 0 and 1 are values."""
    monkeypatch.delenv('GEPO_LMDEPLOY_URL', raising=False)
    config = ROOT / 'configs' / 'gepo_intern_s1_mini.py'
    proc = check(config, '--cfg-options', 'train_cfg.max_staleness=1', env=locations)
    assert proc.returncode == 1
    assert ("train_cfg.max_staleness >= 1 needs a rollout backend that can generate while the "
            "trainer updates: weight_sync mode 'ipc' with sleep_wake=True") in proc.stdout
    proc = check(config, '--cfg-options', 'train_cfg.max_staleness=1',
                 env=dict(locations, GEPO_LMDEPLOY_URL='http://node7:23333', MASTER_ADDR='node1'))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 'generation one batch ahead (max_staleness 1)' in proc.stdout
    # the server's logprobs are raw (temperature 1): no correction for another temperature
    server = dict(locations, GEPO_LMDEPLOY_URL='http://node7:23333', MASTER_ADDR='node1')
    proc = check(config, '--cfg-options', 'train_cfg.max_staleness=1',
                 'train_cfg.sampling.temperature=0.7', env=server)
    assert proc.returncode == 1
    assert ("train_cfg: ValueError: train_cfg.behaviour_correction='truncate' "
            "read(s) the rollout's logprobs as those of the sampling distribution "
            'softmax(logits / 0.7), but the rollout backend reports them at temperature 1'
            ) in proc.stdout
    proc = check(config, '--cfg-options', 'train_cfg.max_staleness=1',
                 'train_cfg.sampling.temperature=0.7', 'train_cfg.behaviour_correction=none',
                 env=server)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = check(ROOT / 'configs' / 'gepo_tiny_cpu.py', '--cfg-options',
                 'train_cfg.max_staleness=-1', env=locations)
    assert proc.returncode == 1 and 'train_cfg.max_staleness must be an int >= 0, got -1' \
        in proc.stdout
    proc = check(ROOT / 'configs' / 'gepo_tiny_cpu.py', '--cfg-options',
                 'train_cfg.max_staleness=3', env=locations)
    assert proc.returncode == 0 and 'streaming generation up to 3 batches ahead' in proc.stdout
