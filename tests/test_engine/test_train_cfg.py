""""check_config OK" means the run starts: every refusal the run makes before it loads a
model or generates, from ``train_cfg`` and from the ``model`` dict, is made by
``tools/check_config.py`` too, with the same message, because both build the same objects
(:class:`~gepo_xtuner.engine.train_cfg.TrainCfg`,
:class:`~gepo_xtuner.model.settings.PolicySettings`).

The refusals are listed from the code: the ``raise`` statements (and ``check_number``
calls) of the functions those objects run. A bad value per refusal is tried on the real
:class:`~gepo_xtuner.engine.loop.RLTrainLoop` / :class:`~gepo_xtuner.model.policy.RLPolicy`
constructors and on check_config (in this process, on ``configs/gepo_tiny_cpu.py``); both
must refuse with the same message. A refusal added to those functions without a bad value
here fails :func:`test_every_refusal_is_tried`.
"""

import ast
import dataclasses
import importlib.util
import inspect
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from gepo_xtuner import settings as settings_module
from gepo_xtuner.engine import train_cfg as train_cfg_module
from gepo_xtuner.engine.loop import RLTrainLoop
from gepo_xtuner.engine.step import validation
from gepo_xtuner.engine.step.update import UpdateSettings, check_training_sampling
from gepo_xtuner.engine.train_cfg import StageSettings, TrainCfg
from gepo_xtuner.loss.behaviour import check_behaviour_correction
from gepo_xtuner.model.policy import RLPolicy
from gepo_xtuner.model.settings import PolicySettings
from gepo_xtuner.registry import ROLLOUT_BACKENDS
from gepo_xtuner.rollout import SamplingParams
from gepo_xtuner.rollout.base import RolloutBackend

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / 'configs' / 'gepo_tiny_cpu.py'
CHECKED = (TrainCfg.from_dict, TrainCfg.check_backend, train_cfg_module._sampling,
           StageSettings.__post_init__, RolloutBackend.check_overlap,
           UpdateSettings.__post_init__, check_behaviour_correction, check_training_sampling,
           SamplingParams.__post_init__, validation.ValSettings.from_dict,
           validation.Benchmark.from_dict, PolicySettings.__post_init__,
           PolicySettings.from_dict, PolicySettings.build_loss,
           settings_module.refuse_unknown, settings_module.check_types)
#: refusal sites no config value reaches, and why
UNREACHABLE = {('SamplingParams.__post_init__', 'self.n < 1'):
               'n is num_responses, refused below 1 first by TrainCfg.from_dict',
               ('PolicySettings.from_dict', 'missing'):
               'RLPolicy takes pretrained and policy_loss as arguments: mmengine refuses first'}
LMDEPLOY = dict(_delete_=True, type='LMDeployRolloutBackend', server_url='http://127.0.0.1:9',
                weight_sync=dict(mode='ipc'))
#: name -> options (check_config's --cfg-options form)
BAD = {
    'unknown_key': {'train_cfg.num_response': 4},
    'wrong_type': {'train_cfg.max_steps': '3'},
    'missing': {'train_cfg.max_steps': None},
    'max_steps': {'train_cfg.max_steps': 0},
    'max_staleness': {'train_cfg.max_staleness': -1},
    'groups_in_flight': {'train_cfg.max_staleness': 2, 'train_cfg.groups_in_flight': 0},
    'partial_without_streaming': {'train_cfg.partial_rollout': True},
    'groups_on_one_thread_backend': {'train_cfg.max_staleness': 2,
                                     'train_cfg.groups_in_flight': 2},
    'partial_on_lmdeploy': {'train_cfg.max_staleness': 2, 'train_cfg.partial_rollout': True,
                            'train_cfg.rollout': LMDEPLOY},
    'entropy_logprobs': {'train_cfg.entropy_logprobs': 'foo'},
    'reward_route_by': {'train_cfg.reward_route_by': 'source'},
    'prompts_per_step': {'train_cfg.prompts_per_step': 0},
    'minibatch': {'train_cfg.minibatch_responses_per_rank': 0},
    'micro_batch_tokens': {'train_cfg.max_tokens_per_micro_batch': 0},
    'kept_rows': {'train_cfg.kept_rows': 'bogus'},
    'norm_length': {'train_cfg.norm_length': -1},
    'behaviour_correction': {'train_cfg.max_staleness': 1,
                             'train_cfg.behaviour_correction': 'bogus'},
    'behaviour_cap': {'train_cfg.behaviour_cap': -1},
    'behaviour_veto': {'train_cfg.behaviour_correction': 'sequence_mask',
                       'train_cfg.behaviour_veto': 1.5},
    'sampling_not_a_dict': {'train_cfg.sampling': [1]},
    'sampling_n': {'train_cfg.sampling.n': 3},
    'negative_temperature': {'train_cfg.sampling.temperature': -1.0},
    'top_p_zero': {'train_cfg.sampling.top_p': 0.0},
    'max_new_tokens': {'train_cfg.sampling.max_new_tokens': 0},
    'greedy': {'train_cfg.sampling.temperature': 0.0},
    'top_p': {'train_cfg.sampling.top_p': 0.9},
    'overlap_with_sleep_wake': {'train_cfg.max_staleness': 1, 'train_cfg.rollout': dict(
        LMDEPLOY, sleep_wake=True)},
    'raw_logprobs_corrected': {'train_cfg.sampling.temperature': 0.7,
                               'train_cfg.behaviour_correction': 'truncate',
                               'train_cfg.rollout': LMDEPLOY},
    'raw_logprobs_vetoed': {'train_cfg.sampling.temperature': 0.7,
                            'train_cfg.behaviour_correction': 'none',
                            'train_cfg.behaviour_veto': 1e-4, 'train_cfg.rollout': LMDEPLOY},
    'val_not_a_dict': {'train_cfg.val': [1]},
    'val_interval': {'train_cfg.val.interval': 0},
    'val_nothing': {'train_cfg.val': dict(_delete_=True, interval=2)},
    'val_temperature': {'train_cfg.val.temperature': -1.0},
    'val_benchmarks_list': {'train_cfg.val.benchmarks': dict(name='a')},
    'val_benchmark_dict': {'train_cfg.val.benchmarks': ['a']},
    'val_benchmark_key': {'train_cfg.val.benchmarks': [dict(name='a', path='x', temp=1)]},
    'val_benchmark_name': {'train_cfg.val.benchmarks': [dict(name='a/b', path='x')]},
    'val_benchmark_path': {'train_cfg.val.benchmarks': [dict(name='a')]},
    'val_benchmark_sampling': {'train_cfg.val.benchmarks': [dict(name='a', path='x',
                                                                 top_p=0.0)]},
    'val_benchmark_twice': {'train_cfg.val.benchmarks': [dict(name='a', path='x'),
                                                         dict(name='a', path='y')]},
    'model_unknown_key': {'model.packng': 'on'},
    'model_packing': {'model.packing': 'bogus'},
    'model_dtype': {'model.torch_dtype': 'float33'},
    'model_kl_coef': {'model.kl_coef': -0.1},
    'model_loss_unknown': {'model.policy_loss': dict(_delete_=True, type='GEPOAdvantage')},
    'model_loss_class': {'model.policy_loss': dict(_delete_=True, type=torch.nn.Identity)},
}


def _check_config():
    spec = importlib.util.spec_from_file_location('check_config_under_test',
                                                  ROOT / 'tools' / 'check_config.py')
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


CHECK_CONFIG = _check_config()


def _cfg(options: dict):
    from mmengine.config import Config
    cfg = Config.fromfile(str(CONFIG))
    cfg.merge_from_dict(options)
    return cfg


def _train_cfg(options: dict) -> dict:
    return {k: v for k, v in _cfg(options).train_cfg.to_dict().items() if k != 'type'}


def _run_refusal(options: dict) -> BaseException:
    """The run's refusal, from the real constructors: RLPolicy for ``model.*`` options
    (refused before any weights load), else RLTrainLoop (what it reads of mmengine's
    runner before the checks is the optimizer wrapper's config)."""
    if any(key.startswith('model.') for key in options):
        model = {k: v for k, v in _cfg(options).model.to_dict().items() if k != 'type'}
        with pytest.raises((TypeError, ValueError)) as err:
            RLPolicy(**model)
        return err.value
    runner = types.SimpleNamespace(optim_wrapper=dict(type='OptimWrapper'), hooks=[])
    loader = torch.utils.data.DataLoader([], batch_size=2)
    with pytest.raises((TypeError, ValueError)) as err:
        RLTrainLoop(runner, loader, **_train_cfg(options))
    return err.value


def _refusal_without_a_runner(options: dict) -> BaseException:
    """The same refusal from the settings objects alone (for the site of each raise)."""
    try:
        if any(key.startswith('model.') for key in options):
            PolicySettings.from_dict(_cfg(options).model.to_dict())
        else:
            cfg = TrainCfg.from_dict(_train_cfg(options))
            cfg.check_backend(ROLLOUT_BACKENDS.build(cfg.rollout))
    except (TypeError, ValueError) as exc:
        return exc
    raise AssertionError(f'{options} was not refused')


def _site(exc: BaseException) -> tuple[str, int]:
    """(function, line) of the innermost frame of a checked function in the traceback."""
    codes = {fn.__code__: fn.__qualname__ for fn in CHECKED}
    site = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            site = (codes[tb.tb_frame.f_code], tb.tb_lineno)
        tb = tb.tb_next
    assert site is not None, f'refused outside the checked functions: {exc!r}'
    return site


def _sites() -> dict[tuple[str, int], str]:
    """Every refusal site of the checked functions: (function, line) -> its condition."""
    out = {}
    for fn in CHECKED:
        lines, first = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent(''.join(lines)))
        for node in ast.walk(tree):
            refuses = isinstance(node, ast.Raise) or (
                isinstance(node, ast.Call) and getattr(node.func, 'id', '') == 'check_number')
            if refuses:
                out[(fn.__qualname__, first + node.lineno - 1)] = ''
        for node in ast.walk(tree):  # the condition each raise sits under, for the message
            if isinstance(node, ast.If):
                for inner in ast.walk(node):
                    key = (fn.__qualname__, first + getattr(inner, 'lineno', 0) - 1)
                    if key in out and not out[key] and inner is not node:
                        out[key] = ast.unparse(node.test)
    return out


@pytest.mark.parametrize('name', list(BAD))
def test_the_run_and_check_config_refuse_alike(name):
    message = str(_run_refusal(BAD[name]))
    report = CHECK_CONFIG.check_one(CONFIG, dict(BAD[name]), False,
                                    CHECK_CONFIG.world_size_of(1))
    assert any(message in p for p in report['problems']), (message, report['problems'])


def test_every_refusal_is_tried():
    hit = {_site(_refusal_without_a_runner(options)) for options in BAD.values()}
    sites = _sites()
    reachable = {k for k, cond in sites.items() if (k[0], cond) not in UNREACHABLE}
    missing = sorted(reachable - hit)
    assert not missing, ('refusals with no bad value in BAD (add one, or list it in '
                         'UNREACHABLE with the reason): '
                         + '; '.join(f'{f} line {line}: if {sites[(f, line)]}'
                                     for f, line in missing))
    assert len(sites) - len(reachable) == len(UNREACHABLE), 'an UNREACHABLE entry matches nothing'


def test_the_good_config_builds_on_both():
    cfg = TrainCfg.from_dict(_train_cfg({}))
    assert cfg.update.behaviour_correction == 'none' and cfg.sampling.n == cfg.num_responses
    assert cfg.update.temperature == cfg.sampling.temperature  # complete when built
    assert cfg.update.norm_length == cfg.sampling.max_new_tokens
    report = CHECK_CONFIG.check_one(CONFIG, {}, False, CHECK_CONFIG.world_size_of(1))
    assert report['problems'] == [], report['problems']


def test_the_corrections_build_and_auto_still_resolves():
    """Every mode and the veto are keys of their own; ``'auto'`` picks ``'truncate'`` with
    generation ahead, else ``'none'``."""
    from gepo_xtuner.loss.behaviour import BEHAVIOUR_CORRECTIONS
    for mode in BEHAVIOUR_CORRECTIONS:
        cfg = TrainCfg.from_dict({**_train_cfg({}), 'behaviour_correction': mode,
                                  'behaviour_veto': 1e-4})
        assert (cfg.update.behaviour_correction, cfg.update.behaviour_veto) == (mode, 1e-4)
    assert TrainCfg.from_dict(_train_cfg({})).update.behaviour_veto is None
    ahead = TrainCfg.from_dict(_train_cfg({'train_cfg.max_staleness': 1}))
    assert ahead.update.behaviour_correction == 'truncate'
    assert TrainCfg.from_dict(_train_cfg({})).update.behaviour_correction == 'none'
    help_text = TrainCfg.help()
    assert all(mode in help_text['behaviour_correction'] for mode in BEHAVIOUR_CORRECTIONS)
    assert 'rollout_is_veto_threshold' in help_text['behaviour_veto']
    assert TrainCfg.defaults()['behaviour_veto'] is None


def test_every_key_is_one_field_with_a_default_and_help():
    """The keys are the fields (a new key is one field); each documented once."""
    keys = TrainCfg.keys()
    assert len(keys) == len(set(keys)), 'two parts own one key'
    help_text = TrainCfg.help()
    assert all(help_text[k] for k in keys), [k for k in keys if not help_text[k]]
    required = {'max_steps', 'rollout', 'advantage', 'rewards'}
    assert set(TrainCfg.defaults()) == set(keys) - required
    fields = {f.name for f in dataclasses.fields(UpdateSettings) if f.metadata.get('key', True)}
    assert fields <= set(keys)
    assert all(PolicySettings.help().get(k) for k in PolicySettings.keys())


def test_a_field_added_to_a_part_is_a_key(monkeypatch):
    """What a new update setting costs: one field on UpdateSettings."""
    extra = dataclasses.make_dataclass(
        'UpdateSettingsPlus', [('new_knob', int, dataclasses.field(default=7))],
        bases=(UpdateSettings, ), frozen=True)
    monkeypatch.setitem(train_cfg_module._PARTS, 'update', extra)
    assert 'new_knob' in TrainCfg.keys() and TrainCfg.defaults()['new_knob'] == 7
    cfg = TrainCfg.from_dict({**_train_cfg({}), 'new_knob': 3})
    assert cfg.update.new_knob == 3
    with pytest.raises(TypeError, match='train_cfg.new_knob must be int'):
        TrainCfg.from_dict({**_train_cfg({}), 'new_knob': 'x'})


def test_the_checkpointed_run_settings_are_those_of_before():
    """``run_settings`` reads the object; a checkpoint's ``settings`` keep their keys and
    values (compared on --resume)."""
    from gepo_xtuner.engine.state.run_state import run_settings
    raw = _train_cfg({'train_cfg.max_staleness': 1})
    got = run_settings(TrainCfg.from_dict(raw), prompts_per_rank=4, world_size=2)
    assert got == dict(num_responses=raw['num_responses'], prompts_per_rank=4,
                       minibatch_responses_per_rank=raw['minibatch_responses_per_rank'],
                       ppo_epochs=raw.get('ppo_epochs', 1), world_size=2,
                       max_steps=raw['max_steps'], advantage=raw['advantage'],
                       kept_rows='full_minibatches', max_staleness=1)


def test_nothing_reads_defaults_from_a_signature():
    """No default is read back with ``inspect`` and the loop takes ``train_cfg`` as one
    mapping: the keys live on the settings objects only."""
    for path in (ROOT / 'gepo_xtuner' / 'engine').rglob('*.py'):
        assert 'inspect.signature' not in path.read_text(), path
    params = inspect.signature(RLTrainLoop.__init__).parameters
    assert [p.kind for p in params.values()][-1] is inspect.Parameter.VAR_KEYWORD
    assert list(params)[:3] == ['self', 'runner', 'dataloader'] and len(params) == 4


def test_check_config_lists_every_key_with_its_default(capsys):
    assert CHECK_CONFIG.main(['--keys']) == 0
    out = capsys.readouterr().out
    listed = {line.split()[0] for line in out.splitlines() if line.startswith('  ')
              and not line.startswith('   ')}
    from gepo_xtuner.engine.step.validation import ValSettings
    assert set(TrainCfg.keys()) | set(ValSettings.keys()) | set(PolicySettings.keys()) == listed
    assert "  ppo_epochs = 1\n" in out and '  max_steps (required)\n' in out
