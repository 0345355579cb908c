""""check_config OK" means the run starts: every refusal the loop makes when it is built,
from the settings that need no model, is made by ``tools/check_config.py`` too.

The refusals are listed from the code: the ``raise`` statements (and ``check_number`` calls)
of the functions :class:`~gepo_xtuner.engine.loop_settings.LoopSettings` runs. A bad value
per refusal is tried on the real :class:`~gepo_xtuner.engine.loop.RLTrainLoop` constructor
and on check_config (in this process, on ``configs/gepo_tiny_cpu.py``); both must refuse
with the same message. A refusal added to those functions without a bad value here fails
:func:`test_every_refusal_is_tried`.
"""

import ast
import importlib.util
import inspect
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from gepo_xtuner.engine.loop import RLTrainLoop
from gepo_xtuner.engine.loop_settings import LoopSettings
from gepo_xtuner.engine.step.update import UpdateSettings, check_training_sampling
from gepo_xtuner.loss.behaviour import check_behaviour_correction
from gepo_xtuner.rollout import SamplingParams
from gepo_xtuner.rollout.base import RolloutBackend

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / 'configs' / 'gepo_tiny_cpu.py'
CHECKED = (LoopSettings.build, LoopSettings.check_backend, RolloutBackend.check_overlap,
           UpdateSettings.__post_init__, check_behaviour_correction, check_training_sampling,
           SamplingParams.__post_init__)
#: refusal sites no train_cfg value reaches, and why
UNREACHABLE = {('SamplingParams.__post_init__', 'self.n < 1'):
               'n is num_responses, refused below 1 first by LoopSettings.build'}
LMDEPLOY = dict(_delete_=True, type='LMDeployRolloutBackend', server_url='http://127.0.0.1:9',
                weight_sync=dict(mode='ipc'))
#: name -> train_cfg options (check_config's --cfg-options form)
BAD = {
    'max_steps': {'train_cfg.max_steps': 0},
    'max_staleness': {'train_cfg.max_staleness': 2},
    'entropy_logprobs': {'train_cfg.entropy_logprobs': 'foo'},
    'minibatch': {'train_cfg.minibatch_responses_per_rank': 0},
    'micro_batch_tokens': {'train_cfg.max_tokens_per_micro_batch': 0},
    'kept_rows': {'train_cfg.kept_rows': 'bogus'},
    'norm_length': {'train_cfg.norm_length': -1},
    'behaviour_correction': {'train_cfg.max_staleness': 1,
                             'train_cfg.behaviour_correction': 'bogus'},
    'behaviour_cap': {'train_cfg.behaviour_cap': -1},
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
}


def _check_config():
    spec = importlib.util.spec_from_file_location('check_config_under_test',
                                                  ROOT / 'tools' / 'check_config.py')
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


CHECK_CONFIG = _check_config()


def _train_cfg(options: dict) -> dict:
    from mmengine.config import Config
    cfg = Config.fromfile(str(CONFIG))
    cfg.merge_from_dict(options)
    return {k: v for k, v in cfg.train_cfg.to_dict().items() if k != 'type'}


def _loop_refusal(options: dict) -> str:
    """The message of the loop's refusal, building the real RLTrainLoop: what it reads of
    mmengine's runner before the checks here is the optimizer wrapper's config."""
    runner = types.SimpleNamespace(optim_wrapper=dict(type='OptimWrapper'), hooks=[])
    loader = torch.utils.data.DataLoader([], batch_size=2)
    with pytest.raises(ValueError) as err:
        RLTrainLoop(runner, loader, **_train_cfg(options))
    return str(err.value)


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
def test_the_loop_and_check_config_refuse_alike(name):
    loop_message = _loop_refusal(BAD[name])
    report = CHECK_CONFIG.check_one(CONFIG, dict(BAD[name]), False,
                                    CHECK_CONFIG.world_size_of(1))
    assert any(loop_message in p for p in report['problems']), (loop_message,
                                                               report['problems'])


def test_every_refusal_is_tried():
    hit = set()
    for options in BAD.values():
        try:
            settings = LoopSettings.from_train_cfg(_train_cfg(options))
            from gepo_xtuner.registry import ROLLOUT_BACKENDS
            settings.check_backend(ROLLOUT_BACKENDS.build(_train_cfg(options)['rollout']))
        except ValueError as exc:
            hit.add(_site(exc))
    sites = _sites()
    reachable = {k for k, cond in sites.items() if (k[0], cond) not in UNREACHABLE}
    missing = sorted(reachable - hit)
    assert not missing, ('refusals with no bad value in BAD (add one, or list it in '
                         'UNREACHABLE with the reason): '
                         + '; '.join(f'{f} line {line}: if {sites[(f, line)]}'
                                     for f, line in missing))
    assert len(sites) - len(reachable) == len(UNREACHABLE), 'an UNREACHABLE entry matches nothing'


def test_the_good_config_builds_on_both():
    settings = LoopSettings.from_train_cfg(_train_cfg({}))
    assert settings.update.behaviour_correction == 'none' and settings.sampling.n >= 1
    report = CHECK_CONFIG.check_one(CONFIG, {}, False, CHECK_CONFIG.world_size_of(1))
    assert report['problems'] == [], report['problems']
