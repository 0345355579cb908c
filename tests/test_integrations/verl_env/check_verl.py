"""GEPO as verl 0.9.1's ``gepo`` advantage estimator, checked inside verl's own environment.

Run by ``tests/test_integrations/test_verl.py`` with ``make verl-deps``'s overlay first on
PYTHONPATH. The plugin arrives the way it does in a user's run: ``import verl`` loads the
``verl.plugins`` entry point this package installs. The batches are real ``DataProto`` and the
advantages come from verl's own ``compute_advantage`` and estimators. verl's checkpointing
runs on a ``RayPPOTrainer`` made without Ray: its actor worker group is a stand-in
(``StandInWorkerGroup``, which records the calls a Ray worker group would get), its data
loader torchdata's ``StatefulDataLoader`` as in verl.
"""

import json
import os

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import verl  # noqa: F401  (loads the plugin through the entry point)
from verl import DataProto
from verl.trainer.ppo import core_algos, metric_utils, ray_trainer
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage

from gepo_xtuner.advantage import AdvantageInputs, GEPOAdvantage
from gepo_xtuner.integrations import verl as plugin

SETTINGS = dict(alpha_low=0.4, alpha_high=0.3, beta_low=0.5, beta_high=0.5, gamma=0.8)


@pytest.fixture(autouse=True)
def fresh_runtime():
    plugin._reset_runtime()
    yield
    plugin._reset_runtime()


def algorithm(**gepo):
    return OmegaConf.create(dict(adv_estimator='gepo', norm_adv_by_std_in_grpo=True,
                                 gamma=1.0, lam=1.0, gepo=dict(SETTINGS, **gepo)))


def make_batch(seed: int, n_prompts: int = 5, k: int = 4, width: int = 9,
               fields=('old_log_probs',)) -> DataProto:
    """A right-padded verl batch: outcome rewards on each response's last token."""
    g = torch.Generator().manual_seed(seed)
    n = n_prompts * k
    lengths = torch.randint(2, width + 1, (n,), generator=g)
    mask = (torch.arange(width) < lengths.unsqueeze(1)).float()
    rewards = torch.zeros(n, width)
    rewards[torch.arange(n), lengths - 1] = torch.randint(0, 2, (n,), generator=g).float()
    scale = torch.rand(n_prompts, generator=g).repeat_interleave(k).unsqueeze(1) * 2 + 0.1
    tensors = dict(token_level_rewards=rewards, response_mask=mask)
    for field in fields:
        tensors[field] = -torch.rand(n, width, generator=g) * scale * mask
    uid = np.array([f'{seed}-{i // k}' for i in torch.randperm(n, generator=g).tolist()],
                   dtype=object)
    return DataProto.from_dict(tensors=tensors, non_tensors=dict(uid=uid))


def core_advantages(data: DataProto, gepo: GEPOAdvantage, state) -> torch.Tensor:
    uid = data.non_tensor_batch['uid'].tolist()
    index = {u: i for i, u in enumerate(dict.fromkeys(uid))}
    batch = AdvantageInputs(rewards=data.batch['token_level_rewards'].sum(-1).double(),
                            group_ids=torch.tensor([index[u] for u in uid]),
                            logprobs=data.batch['old_log_probs'],
                            mask=data.batch['response_mask'].bool())
    return gepo(batch, state).advantages


# -- the plugin as verl loads it -------------------------------------------------------------
def test_import_verl_loads_the_plugin_and_every_trainer_gets_the_wrapper():
    from verl.experimental.separation import ray_trainer as separation
    from verl.trainer.ppo.v1 import trainer_base, utils as v1_utils

    assert 'gepo' in core_algos.ADV_ESTIMATOR_REGISTRY
    for module in (ray_trainer, v1_utils, separation):
        assert module.compute_advantage is compute_advantage, module.__name__
        assert compute_advantage.__wrapped__.__module__ == 'verl.trainer.ppo.ray_trainer'
    for module in (ray_trainer, trainer_base, separation):
        assert module.compute_data_metrics is metric_utils.compute_data_metrics, module.__name__
    for cls in (RayPPOTrainer, trainer_base.PPOTrainer):
        assert cls._save_checkpoint.gepo and cls._load_checkpoint.gepo


def test_other_estimators_are_verls_own_untouched():
    data = make_batch(0)
    ours = compute_advantage(make_batch(0), adv_estimator='grpo', config=algorithm())
    verls = compute_advantage.__wrapped__(data, adv_estimator='grpo', config=algorithm())
    assert torch.equal(ours.batch['advantages'], verls.batch['advantages'])
    assert plugin._RUNTIME is None


# -- the shaping ---------------------------------------------------------------------------
@pytest.mark.parametrize('base,norm', [('grpo', True), ('grpo', False), ('grpo_vectorized', True),
                                       ('rloo', True)])
def test_gepo_over_verls_estimators_equals_the_core_over_that_base(base, norm):
    """Three steps: verl's base advantages, shaped, equal the core's GEPO given those
    advantages as the base, with one band update per step; returns follow advantages."""
    config = algorithm(base=base)
    config.norm_adv_by_std_in_grpo = norm
    gepo = GEPOAdvantage(**SETTINGS)
    state = gepo.init_state()
    shaped_any = False
    for step in range(3):
        base_data = compute_advantage.__wrapped__(make_batch(step), adv_estimator=base,
                                                  norm_adv_by_std_in_grpo=norm, config=config)
        data = compute_advantage(make_batch(step), adv_estimator='gepo',
                                 norm_adv_by_std_in_grpo=norm, config=config)
        mask = data.batch['response_mask'].bool()
        first = mask.float().argmax(-1)
        rows = torch.arange(len(first))
        base_adv = base_data.batch['advantages'][rows, first]
        uid = data.non_tensor_batch['uid'].tolist()
        index = {u: i for i, u in enumerate(dict.fromkeys(uid))}
        expected = gepo(AdvantageInputs(
            rewards=data.batch['token_level_rewards'].sum(-1).double(),
            group_ids=torch.tensor([index[u] for u in uid]),
            logprobs=data.batch['old_log_probs'], mask=mask), state,
            base_advantages=base_adv).advantages
        got = data.batch['advantages']
        torch.testing.assert_close(got, expected.unsqueeze(-1) * mask, rtol=0, atol=1e-6)
        assert torch.equal(data.batch['returns'], got)
        assert plugin.runtime().state.state_dict() == state.state_dict()
        shaped_any |= bool((got[rows, first] != base_adv).any())
    assert shaped_any and state.num_updates == 3


def test_rollout_logprobs_are_preferred_and_can_be_required():
    data = make_batch(1, fields=('old_log_probs', 'rollout_log_probs'))
    shaper = plugin.GEPOVerl(**SETTINGS)
    assert shaper.logprob_field(data.batch.keys()) == 'rollout_log_probs'
    assert plugin.GEPOVerl(logprobs='old').logprob_field(data.batch.keys()) == 'old_log_probs'
    with pytest.raises(KeyError, match='calculate_log_probs=True'):
        plugin.GEPOVerl(logprobs='rollout').logprob_field(make_batch(1).batch.keys())
    with pytest.raises(KeyError, match='neither rollout_log_probs'):
        compute_advantage(make_batch(1, fields=()), adv_estimator='gepo', config=algorithm())


def test_gepo_metrics_reach_verls_data_metrics_once():
    data = compute_advantage(make_batch(2), adv_estimator='gepo', config=algorithm())
    n, width = data.batch['response_mask'].shape
    data.batch['token_level_scores'] = data.batch['token_level_rewards']
    data.batch['responses'] = torch.ones(n, width, dtype=torch.long)
    data.batch['prompts'] = torch.ones(n, 3, dtype=torch.long)
    data.batch['attention_mask'] = torch.cat([torch.ones(n, 3), data.batch['response_mask']], 1)
    metrics = metric_utils.compute_data_metrics(batch=data, use_critic=False)
    assert metrics['gepo/num_updates'] == 1.0 and 'shaping/frac_damped_pos' in metrics
    assert 'critic/advantages/mean' in metrics  # verl's own
    again = metric_utils.compute_data_metrics(batch=data, use_critic=False)
    assert not [key for key in again if key.startswith('gepo/')]


@pytest.mark.parametrize('base', ['remax', 'optimal_token_baseline'])
def test_bases_whose_inputs_verl_makes_only_for_itself_are_refused(base):
    with pytest.raises(ValueError, match='prepares its inputs only'):
        compute_advantage(make_batch(0), adv_estimator='gepo', config=algorithm(base=base))


@pytest.mark.parametrize('base', ['gae', 'gepo'])
def test_token_level_and_circular_bases_are_refused(base):
    with pytest.raises(ValueError, match='one advantage per response'):
        compute_advantage(make_batch(0), adv_estimator='gepo', config=algorithm(base=base))


def test_advantages_that_vary_along_a_response_are_refused():
    data = make_batch(0)
    adv = torch.randn_like(data.batch['response_mask'])
    data.batch['advantages'] = adv
    with pytest.raises(ValueError, match='vary along a response'):
        plugin.GEPOVerl(**SETTINGS)(data)


def test_the_registered_estimator_called_alone_says_why():
    fn = core_algos.get_adv_estimator_fn('gepo')
    with pytest.raises(RuntimeError, match='compute_advantage'):
        fn(token_level_rewards=None, response_mask=None, config=None)


def test_an_unknown_setting_is_named():
    with pytest.raises(ValueError, match='algorithm.gepo: .*alpha_lo'):
        plugin.GEPOVerl(alpha_lo=0.5)


def test_settings_that_change_during_a_run_are_refused():
    compute_advantage(make_batch(0), adv_estimator='gepo', config=algorithm())
    with pytest.raises(ValueError, match='changed during the run'):
        compute_advantage(make_batch(1), adv_estimator='gepo', config=algorithm(gamma=0.5))


# -- the band in verl's checkpoints ----------------------------------------------------------
class StandInWorkerGroup:
    """Stands in for verl's Ray actor worker group (no Ray cluster here): records the
    checkpoint calls and writes a file where the worker would write its shards."""

    def __init__(self):
        self.calls = []

    def save_checkpoint(self, local_path, hdfs_path, global_step, max_ckpt_to_keep=None):
        self.calls.append(('save', local_path, global_step))
        os.makedirs(local_path, exist_ok=True)
        open(os.path.join(local_path, 'shard.pt'), 'w').close()

    def load_checkpoint(self, local_path, del_local_after_load=False):
        self.calls.append(('load', local_path))


def trainer(root, resume_mode='auto', resume_from_path=None) -> RayPPOTrainer:
    from torchdata.stateful_dataloader import StatefulDataLoader
    t = RayPPOTrainer.__new__(RayPPOTrainer)
    t.config = OmegaConf.create(dict(
        algorithm=algorithm(),
        trainer=dict(default_local_dir=str(root), default_hdfs_dir=None, resume_mode=resume_mode,
                     resume_from_path=resume_from_path, del_local_ckpt_after_load=False),
        actor_rollout_ref=dict(actor=dict(checkpoint=dict(async_save=False)))))
    t.actor_rollout_wg = StandInWorkerGroup()
    t.use_critic = False
    t.train_dataloader = StatefulDataLoader(list(range(40)), batch_size=4)
    t.global_steps = 0
    return t


def run_steps(t: RayPPOTrainer, steps) -> list[torch.Tensor]:
    out = []
    for step in steps:
        t.global_steps = step
        data = compute_advantage(make_batch(step), adv_estimator='gepo',
                                 config=t.config.algorithm)
        out.append(data.batch['advantages'])
    return out


def test_save_then_resume_continues_with_the_same_band(tmp_path):
    straight = trainer(tmp_path / 'a')
    expected = run_steps(straight, [1, 2, 3, 4])
    plugin._reset_runtime()

    first = trainer(tmp_path / 'b')
    run_steps(first, [1, 2])
    first._save_checkpoint()
    folder = tmp_path / 'b' / 'global_step_2'
    saved = json.loads((folder / plugin.STATE_FILE).read_text())
    assert saved['state'] == plugin.runtime().state.state_dict()
    assert (folder / 'data.pt').is_file()
    assert (tmp_path / 'b' / 'latest_checkpointed_iteration.txt').read_text() == '2'
    plugin._reset_runtime()  # a new driver process

    resumed = trainer(tmp_path / 'b')
    resumed._load_checkpoint()
    assert resumed.global_steps == 2
    assert plugin.runtime().state.state_dict() == saved['state']
    for want, got in zip(expected[2:], run_steps(resumed, [3, 4])):
        assert torch.equal(want, got)


def test_resume_with_other_settings_is_refused(tmp_path):
    t = trainer(tmp_path)
    run_steps(t, [1])
    t._save_checkpoint()
    plugin._reset_runtime()
    other = trainer(tmp_path)
    other.config.algorithm.gepo.gamma = 0.5
    with pytest.raises(ValueError, match='resume with the same settings'):
        other._load_checkpoint()


def test_a_patched_module_keeps_its_loaders_other_methods():
    loader = ray_trainer.__spec__.loader
    assert isinstance(loader, plugin._PatchingLoader)
    assert 'def compute_advantage' in loader.get_source('verl.trainer.ppo.ray_trainer')


def test_resume_from_a_checkpoint_without_the_band_is_refused(tmp_path):
    t = trainer(tmp_path)
    run_steps(t, [1])
    t._save_checkpoint()
    os.remove(tmp_path / 'global_step_1' / plugin.STATE_FILE)
    plugin._reset_runtime()
    with pytest.raises(FileNotFoundError, match='resuming would restart the entropy band'):
        trainer(tmp_path, resume_mode='resume_path',
                resume_from_path=str(tmp_path / 'global_step_1'))._load_checkpoint()


def test_conformance_with_the_core():
    """The conformance batch (tests/test_integrations/conformance.py) through this path."""
    from tests.test_integrations import conformance
    conformance.check('verl')
