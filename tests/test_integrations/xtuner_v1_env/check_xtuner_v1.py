"""GEPO in XTuner v1's RL trainer, against the real v1 classes.

Runs only inside the XTuner v1 overlay (``make xtuner-v1-deps``), in a process of its
own: tests/test_integrations/test_xtuner_v1.py starts it. v1's Ray controllers (train
workers, agent-loop manager) need GPUs and a Ray cluster; the checkpoint tests give
the trainer stand-ins for those two that write marker files. Everything GEPO touches
(``_prepare_train_data``, ``_maybe_save_checkpoint``, ``XTunerMeta``, auto-resume's
checkpoint resolution, ``_resume_train_controller_and_state``) is v1's own code.
"""

import asyncio
import logging
import os
import random
import types
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from xtuner.v1.data_proto.rl_data import RolloutState, Status
from xtuner.v1.rl.advantage import GRPOAdvantageConfig
from xtuner.v1.train.rl_trainer import RLColocateTrainer
from xtuner.v1.train.trainer import LoadCheckpointConfig

from gepo_xtuner.advantage import GEPOAdvantage, AdvantageInputs
from gepo_xtuner.integrations.xtuner_v1 import (GEPOAdvantageConfig, GEPOEstimator,
                                                GEPORLColocateTrainer,
                                                GEPORLColocateTrainerConfig)

ROOT = Path(__file__).resolve().parents[3]
PACK = 1 << 16
TASKS = ('math', 'physics', 'instruction_following')


def make_step(rng: random.Random, step: int, num_groups: int = 12, k: int = 4) -> list[list[RolloutState]]:
    """One step's prompt groups; every response's tokens are unique (they identify it).

    Groups differ in entropy scale (their logprobs' temperature), some responses have
    masked tokens (tool output), one group has equal rewards, one failed (v1 skips it),
    and some responses are stale partial rollouts.
    """
    groups = []
    for g in range(num_groups):
        scale = rng.choice([0.2, 0.5, 1.0, 2.0]) * rng.uniform(0.8, 1.2)
        group = []
        for i in range(k):
            uid = (step * 1000 + g) * 100 + i
            length = rng.randint(3, 12)
            mask = [0 if rng.random() < 0.15 else 1 for _ in range(length)]
            reward = 0.5 if g == 0 else float(rng.random() < 0.5)
            group.append(RolloutState(
                message=[{'role': 'user', 'content': f'prompt {g}'}],
                prompt_ids=[1, 2, 3 + g],
                response='text',
                response_ids=[10_000_000 + uid * 20 + t for t in range(length)],
                logprobs=[-rng.expovariate(1 / scale) for _ in range(length)],
                response_mask=mask,
                reward={'score': reward},
                rollout_id=uid,
                task_name=TASKS[g % len(TASKS)],
                seq_staleness=int(rng.random() < 0.3),
                status=Status.FAILED if g == 1 else Status.COMPLETED))
        groups.append(group)
    return groups


def reference_batch(groups: list[list[RolloutState]]) -> tuple[AdvantageInputs, list[int]]:
    """The same rollouts as one flat batch for GEPOAdvantage, built from the raw fields."""
    rows = [(g, s) for g, group in enumerate(groups) if group[0].status == Status.COMPLETED
            for s in group]
    max_len = max(len(s.response_ids) for _, s in rows)
    lps = torch.zeros(len(rows), max_len)
    mask = torch.zeros(len(rows), max_len, dtype=torch.bool)
    for r, (_, s) in enumerate(rows):
        n = len(s.logprobs)
        lps[r, :n] = torch.tensor(s.logprobs)
        mask[r, :n] = torch.tensor(s.response_mask, dtype=torch.bool)
    batch = AdvantageInputs(rewards=torch.tensor([s.reward['score'] for _, s in rows]),
                            group_ids=torch.tensor([g for g, _ in rows]), logprobs=lps, mask=mask)
    return batch, [s.rollout_id for _, s in rows]


def bare_trainer(cls: type, advantage_config) -> RLColocateTrainer:
    """A v1 trainer object without Ray workers: what ``_prepare_train_data`` reads."""
    trainer = cls.__new__(cls)
    trainer._advantage_estimator = advantage_config.build()
    trainer.logger = logging.getLogger('xtuner_v1_check')
    trainer.logger.setLevel(logging.CRITICAL)  # v1 logs each skipped group in full
    trainer.tokenizer = None
    return trainer


def train_advantages(trainer: RLColocateTrainer, groups) -> tuple[dict[int, float], dict]:
    """Runs v1's ``_prepare_train_data``; maps rollout_id -> the advantage it trains with."""
    by_token = {s.response_ids[0]: s.rollout_id for group in groups for s in group}
    random.seed(0)  # v1 shuffles the packed samples
    data_batches, info = trainer._prepare_train_data(groups, PACK)
    adv = {}
    for item in data_batches:
        first_response_token = int(item['seq_ctx'].input_ids[0, 3])
        values = {a for a in item['advantage'] if a != 0.0}
        assert len(values) <= 1
        adv[by_token[first_response_token]] = values.pop() if values else 0.0
    return adv, info


def test_prepare_train_data_matches_gepo_advantage():
    rng = random.Random(0)
    trainer = bare_trainer(GEPORLColocateTrainer, GEPOAdvantageConfig())
    reference, state = GEPOAdvantage(), GEPOAdvantage().init_state()
    shaped = 0
    for step in range(1, 5):
        groups = make_step(rng, step)
        adv, info = train_advantages(trainer, groups)
        batch, ids = reference_batch(groups)
        out = reference(batch, state)
        expected = dict(zip(ids, out.advantages.tolist()))
        assert adv.keys() == expected.keys()  # the failed group is left out by both
        for rid, value in expected.items():
            assert adv[rid] == pytest.approx(value, abs=1e-6), (step, rid)
        assert info['gepo/h_low'] == pytest.approx(out.metrics['gepo/h_low'], rel=1e-6)
        assert info['gepo/num_updates'] == step
        assert 0 < info['gepo/stale_response_frac'] < 1
        shaped += int(out.shaped.sum())
    ours, ref = trainer._advantage_estimator.state.state_dict(), state.state_dict()
    assert ours['num_updates'] == ref['num_updates'] == 4
    assert ours['h_high'] == pytest.approx(ref['h_high'], rel=1e-6)
    assert shaped > 0  # the check above compared shaped advantages, not only GRPO's


def test_sessions_of_agentic_segments_share_one_advantage_and_entropy():
    """``input_ids``-form segments of one session: one GRPO sample, entropy of all segments."""
    groups, lps_by_session, rewards = [], {}, {}
    rng = random.Random(1)
    for g in range(4):
        group = []
        for sess in range(3):
            session_id = g * 10 + sess
            reward = float(rng.random() < 0.5) if g else float(sess == 0)
            for seg in range(2):
                n = rng.randint(4, 8)
                labels = [-100, -100] + [rng.randrange(5, 90) if rng.random() < 0.8 else -100
                                         for _ in range(n - 2)]
                lps = [-rng.expovariate(1 / (0.3 + g)) for _ in range(n)]
                group.append(RolloutState(
                    message=[{'role': 'user', 'content': 'q'}], response='t',
                    input_ids=[1000 + session_id * 10 + seg] + [7] * (n - 1), labels=labels,
                    logprobs=lps, reward={'score': reward}, rollout_id=session_id * 10 + seg,
                    session_id=session_id, status=Status.COMPLETED))
                kept = [lp for lp, lab in zip(lps[1:], labels[1:]) if lab != -100]
                lps_by_session.setdefault(session_id, []).extend(kept)
                rewards[session_id] = reward
        groups.append(group)
    trainer = bare_trainer(GEPORLColocateTrainer, GEPOAdvantageConfig(gamma=1.0))
    random.seed(0)
    data_batches, _ = trainer._prepare_train_data(groups, PACK)
    got = {}
    for item in data_batches:
        session = (int(item['seq_ctx'].input_ids[0, 0]) - 1000) // 10
        values = {a for a in item['advantage'] if a != 0.0}
        got.setdefault(session, set()).update(values or {0.0})
    sessions = sorted(lps_by_session)
    max_len = max(len(lps_by_session[s]) for s in sessions)
    lps = torch.zeros(len(sessions), max_len)
    mask = torch.zeros(len(sessions), max_len, dtype=torch.bool)
    for r, s in enumerate(sessions):
        lps[r, :len(lps_by_session[s])] = torch.tensor(lps_by_session[s])
        mask[r, :len(lps_by_session[s])] = True
    out = GEPOAdvantage(gamma=1.0)(AdvantageInputs(
        rewards=torch.tensor([rewards[s] for s in sessions], dtype=torch.float64),
        group_ids=torch.tensor([s // 10 for s in sessions]), logprobs=lps, mask=mask),
        GEPOAdvantage(gamma=1.0).init_state())
    for s, value in zip(sessions, out.advantages.tolist()):
        assert len(got[s]) == 1 and got[s].pop() == pytest.approx(value, abs=1e-6)


def test_grpo_config_is_unchanged_by_the_gepo_trainer():
    rng = random.Random(2)
    for step in range(1, 3):
        groups = make_step(rng, step)
        ours, ours_info = train_advantages(bare_trainer(GEPORLColocateTrainer,
                                                        GRPOAdvantageConfig()), groups)
        v1, v1_info = train_advantages(bare_trainer(RLColocateTrainer, GRPOAdvantageConfig()),
                                       groups)
        assert ours == v1 and ours_info == v1_info


def test_v1_trainer_without_the_batch_pass_refuses_gepo():
    groups = make_step(random.Random(3), 1)
    with pytest.raises(RuntimeError, match='GEPORLColocateTrainerConfig'):
        bare_trainer(RLColocateTrainer, GEPOAdvantageConfig())._prepare_train_data(groups, PACK)


# ---- checkpoints: v1's save and resume paths --------------------------------------------
class TrainControllerStandIn:
    """v1's TrainingController is a Ray actor group; this writes what its save would."""

    def save(self, path: str, no_save_optimizer: bool) -> None:
        Path(path, 'model_and_optimizer').write_text('dcp stand-in')

    def resume(self, load_checkpoint_cfg) -> None:
        assert Path(load_checkpoint_cfg.checkpoint_path, 'model_and_optimizer').is_file()


class AgentLoopManagerStandIn:
    async def save(self, path, model_step: int, no_save_replay_buffer: bool) -> None:
        Path(path, 'sampler').write_text(str(model_step))


def checkpointing_trainer(work_dir: Path, auto_resume: bool) -> GEPORLColocateTrainer:
    """A GEPO trainer set up by v1's own ``_init_work_dir_and_meta`` / ``_init_save_config``."""
    trainer = bare_trainer(GEPORLColocateTrainer, GEPOAdvantageConfig())
    cfg = types.SimpleNamespace(
        work_dir=str(work_dir), auto_resume=auto_resume, hf_max_keep=None, hf_interval=None,
        checkpoint_interval=2, checkpoint_maxkeep=1, checkpoint_no_save_optimizer=False,
        checkpoint_no_save_replay_buffer=False, load_checkpoint_cfg=LoadCheckpointConfig())
    trainer._init_work_dir_and_meta(cfg, GEPORLColocateTrainer._META_PATH)
    trainer._init_save_config(cfg)
    trainer.train_controller = TrainControllerStandIn()
    trainer.agent_loop_manager = AgentLoopManagerStandIn()
    return trainer


def test_save_then_auto_resume_continues_bit_for_bit(tmp_path):
    """Save at step 2 (interval 2), resume through v1's auto_resume, replay steps 3-4."""
    steps = [make_step(random.Random(20 + s), s) for s in range(1, 5)]
    first = checkpointing_trainer(tmp_path, auto_resume=False)
    uninterrupted = []
    for step, groups in enumerate(steps, 1):
        adv, _ = train_advantages(first, groups)
        if step <= 3:  # v1 saves at step 2 only; steps 1 and 3 must write nothing
            asyncio.run(first._maybe_save_checkpoint(step))
        if step == 2:
            saved = first._advantage_estimator.state_dict()
        if step > 2:
            uninterrupted.append(adv)
    ckpt = Path(first._meta.latest_exp.checkpoint_list[-1])
    assert [Path(c).name for c in first._meta.latest_exp.checkpoint_list] == ['ckpt-step-2']
    assert (ckpt / 'train_state.json').is_file() and (ckpt / GEPOEstimator.state_filename).is_file()

    resumed = checkpointing_trainer(tmp_path, auto_resume=True)  # v1 resolves the latest ckpt
    assert Path(resumed._load_checkpoint_cfg.checkpoint_path) == ckpt
    assert resumed._advantage_estimator.state.num_updates == 0
    resumed._resume_train_controller_and_state(resumed._load_checkpoint_cfg.checkpoint_path)
    assert resumed._cur_step == 2
    state = resumed._advantage_estimator.state_dict()
    assert state == saved
    for key in ('h_low', 'h_high'):
        assert state[key].hex() == saved[key].hex()  # bit for bit
    continued = [train_advantages(resumed, groups)[0] for groups in steps[2:]]
    assert continued == uninterrupted  # exactly, not approximately


def test_checkpoint_without_state_resumes_with_a_fresh_band(tmp_path, caplog):
    first = checkpointing_trainer(tmp_path, auto_resume=False)
    train_advantages(first, make_step(random.Random(5), 1))
    asyncio.run(first._maybe_save_checkpoint(2))
    ckpt = Path(first._meta.latest_exp.checkpoint_list[-1])
    (ckpt / GEPOEstimator.state_filename).unlink()  # as saved by v1's own trainer
    resumed = checkpointing_trainer(tmp_path, auto_resume=True)
    with caplog.at_level(logging.WARNING, logger='xtuner_v1_check'):
        resumed._resume_train_controller_and_state(ckpt)
    assert 'fresh state' in caplog.text
    assert resumed._advantage_estimator.state.num_updates == 0


# ---- configs ------------------------------------------------------------------------------
def test_config_defaults_and_validation():
    cfg = GEPOAdvantageConfig()
    assert (cfg.alpha_low, cfg.alpha_high, cfg.beta_low, cfg.beta_high, cfg.gamma, cfg.eps) == (
        0.5, 0.2, 0.2, 0.3, 0.01, 1e-8)
    with pytest.raises(ValidationError, match='alpha_low'):
        GEPOAdvantageConfig(alpha_low=1.5)
    with pytest.raises(ValidationError, match='gamma'):
        GEPOAdvantageConfig(gamma=0.0)
    with pytest.raises(ValidationError):
        GEPOAdvantageConfig(alpha=0.5)  # extra="forbid", like v1's own configs


def test_example_config_builds_the_trainer_config(tmp_path, monkeypatch):
    from transformers import Qwen3_5Config
    from xtuner.v1.utils import Config

    model_dir = tmp_path / 'Qwen3.5-9B'
    model_dir.mkdir()
    Qwen3_5Config().save_pretrained(model_dir)  # transformers' own Qwen3.5 config layout
    monkeypatch.setenv('WORK_DIR', str(tmp_path / 'work'))
    monkeypatch.setenv('MODEL_PATH', str(model_dir))
    monkeypatch.setenv('DATA_PATH', str(tmp_path / 'train.jsonl'))
    monkeypatch.setenv('EVAL_DATA_PATH', str(tmp_path / 'val.jsonl'))
    monkeypatch.setenv('XTUNER_USE_LMDEPLOY', '1')  # v1's RolloutConfig asks for a backend
    cfg = Config.fromfile(str(ROOT / 'configs' / 'xtuner_v1' / 'gepo_qwen3_5_9b.py'))
    trainer_cfg = cfg.trainer
    assert type(trainer_cfg) is GEPORLColocateTrainerConfig
    adv = trainer_cfg.advantage_estimator_config
    assert type(adv) is GEPOAdvantageConfig
    assert (adv.alpha_low, adv.alpha_high, adv.beta_low, adv.beta_high, adv.gamma) == (
        0.5, 0.2, 0.2, 0.3, 0.01)
    assert isinstance(adv.build(), GEPOEstimator)
    text = trainer_cfg.train_worker_cfg.model_cfg.text_config
    hf_text = Qwen3_5Config().text_config
    assert (text.hidden_size, text.num_hidden_layers) == (hf_text.hidden_size,
                                                          hf_text.num_hidden_layers)
    assert trainer_cfg.train_batch_size == 256
    assert os.environ['MODEL_PATH'] == str(model_dir)


def test_conformance_with_the_core():
    """The conformance batch (tests/test_integrations/conformance.py) through this path."""
    from tests.test_integrations import conformance
    conformance.check('xtuner_v1')
