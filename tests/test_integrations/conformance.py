"""One batch through GEPO's five paths: this core, XTuner v1, TRL, verl and slime.

Each path runs in the environment it needs (TRL, verl and XTuner v1 each pin their own
transformers), so this module imports only torch and the core at the top, and each
``through_*`` function imports its stack; :func:`check` compares a path with the core in
whatever environment it runs. ``test_conformance.py`` checks the core, slime and TRL (a
process with TRL's overlay); the suites that already run in verl's and XTuner v1's
environments (``verl_env/``, ``xtuner_v1_env/``) check theirs.
The batch: three steps (the band's EMA moves), each 7 prompts x 4 responses whose rows are
shuffled (a group's rows are not adjacent), response lengths of 2-11 tokens with some tokens
masked (tool output), groups of different entropy scales, one group with equal rewards. A
path gets the batch in the form its trainer has it and returns, per step, each response's
shaped advantage (in the batch's row order) and the band after the step.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import torch

#: GEPO's settings on every path; gamma < 1 so the band's EMA is exercised.
SETTINGS = dict(alpha_low=0.4, alpha_high=0.3, beta_low=0.5, beta_high=0.5, gamma=0.8)
#: The base estimator every path uses: GRPO with Bessel's std and this epsilon, the one
#: verl, slime and the core share (verl's and slime's are fixed at 1e-6).
EPS = 1e-6
STEPS, GROUPS, K = 3, 7, 4


def make_batches(seed: int = 0) -> list[dict[str, list]]:
    """The steps' batches: ``rewards (N,)``, ``uid (N,)``, ``logprobs``/``mask`` (N lists)."""
    rng = random.Random(seed)
    steps = []
    for step in range(STEPS):
        rows = []
        for g in range(GROUPS):
            scale = rng.choice([0.1, 0.4, 1.0, 2.5]) * rng.uniform(0.8, 1.2)
            for _ in range(K):
                length = rng.randint(2, 11)
                mask = [0 if rng.random() < 0.2 else 1 for _ in range(length)]
                mask[0] = 1
                rows.append(dict(uid=f'step{step}-prompt{g}',
                                 reward=1.0 if g == 0 else float(rng.random() < 0.5),
                                 logprobs=[-rng.expovariate(1 / scale) for _ in range(length)],
                                 mask=mask))
        rng.shuffle(rows)
        steps.append({key: [row[key] for row in rows]
                      for key in ('uid', 'reward', 'logprobs', 'mask')})
    return steps


def _padded(batch: dict[str, list]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(lps) for lps in batch['logprobs'])
    logprobs = torch.zeros(len(batch['uid']), width)
    mask = torch.zeros(len(batch['uid']), width, dtype=torch.bool)
    for row, (lps, m) in enumerate(zip(batch['logprobs'], batch['mask'])):
        logprobs[row, :len(lps)] = torch.tensor(lps)
        mask[row, :len(m)] = torch.tensor(m, dtype=torch.bool)
    return logprobs, mask


def _group_ids(uids: list[str]) -> torch.Tensor:
    index = {uid: i for i, uid in enumerate(dict.fromkeys(uids))}
    return torch.tensor([index[uid] for uid in uids])


def _result(advantages: Any, state: Any) -> dict[str, Any]:
    return dict(advantages=[float(a) for a in advantages], band=dict(state.state_dict()))


def through_core(batches: list[dict[str, list]]) -> list[dict[str, Any]]:
    """This project's processor: ``GEPOAdvantage`` with its GRPO base."""
    from gepo_xtuner.advantage import AdvantageInputs, GEPOAdvantage
    gepo = GEPOAdvantage(eps=EPS, **SETTINGS)
    state, out = gepo.init_state(), []
    for batch in batches:
        logprobs, mask = _padded(batch)
        result = gepo(AdvantageInputs(rewards=torch.tensor(batch['reward'], dtype=torch.float64),
                                      group_ids=_group_ids(batch['uid']), logprobs=logprobs,
                                      mask=mask), state)
        out.append(_result(result.advantages.tolist(), state))
    return out


def through_slime(batches: list[dict[str, list]]) -> list[dict[str, Any]]:
    """slime's reward post-process: ``Sample``s as slime's rollout manager passes them."""
    from gepo_xtuner.integrations.slime import GEPOPostProcess
    post = GEPOPostProcess(**SETTINGS)
    args = SimpleNamespace(advantage_estimator='grpo', rewards_normalization=True,
                           grpo_std_normalization=True, n_samples_per_prompt=K, reward_key=None,
                           save=None, load=None, start_rollout_id=None)
    out = []
    for batch in batches:
        samples = [SimpleNamespace(index=i, group_index=uid, reward=reward,
                                   rollout_log_probs=lps, loss_mask=mask, remove_sample=False)
                   for i, (uid, reward, lps, mask) in enumerate(zip(
                       batch['uid'], batch['reward'], batch['logprobs'], batch['mask']))]
        _, advantages = post(args, samples)
        out.append(_result(advantages, post.state))
    return out


def through_verl(batches: list[dict[str, list]]) -> list[dict[str, Any]]:
    """verl's ``compute_advantage`` on a ``DataProto`` with ``adv_estimator='gepo'``.

    verl's batch is right-padded ``(N, T)``: the reward on each response's last token,
    ``rollout_log_probs`` and ``response_mask`` (0 on masked tokens and padding).
    """
    import numpy as np
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from gepo_xtuner.integrations import verl as plugin
    plugin._reset_runtime()
    config = OmegaConf.create(dict(adv_estimator='gepo', norm_adv_by_std_in_grpo=True,
                                   gepo=dict(base='grpo', logprobs='rollout', **SETTINGS)))
    out = []
    for batch in batches:
        logprobs, mask = _padded(batch)
        last = torch.tensor([len(lps) - 1 for lps in batch['logprobs']])
        rewards = torch.zeros_like(logprobs)
        rewards[torch.arange(len(last)), last] = torch.tensor(batch['reward'])
        data = DataProto.from_dict(
            tensors=dict(token_level_rewards=rewards, response_mask=mask.float(),
                         rollout_log_probs=logprobs),
            non_tensors=dict(uid=np.array(batch['uid'], dtype=object)))
        data = compute_advantage(data, adv_estimator='gepo', config=config)
        adv = data.batch['advantages']
        first = mask.float().argmax(-1)  # a response's value sits on each of its tokens
        out.append(_result(adv[torch.arange(len(first)), first].tolist(),
                           plugin.runtime().state))
    return out


def through_trl(batches: list[dict[str, list]]) -> list[dict[str, Any]]:
    """TRL's path: its gathered batch (a prompt's K completions adjacent, TRL's order) with
    TRL's advantages as the base; here the base is GRPO with :data:`EPS`, which TRL computes
    with its own epsilon (1e-4)."""
    from gepo_xtuner.advantage import AdvantageInputs, GEPOAdvantage, GRPOAdvantage
    from gepo_xtuner.integrations.trl import shape_gathered
    gepo = GEPOAdvantage(**SETTINGS)
    state, out = gepo.init_state(), []
    for batch in batches:
        order = sorted(range(len(batch['uid'])), key=lambda i: (batch['uid'][i], i))
        logprobs, mask = _padded(batch)
        rewards = torch.tensor(batch['reward'], dtype=torch.float64)
        base = GRPOAdvantage(eps=EPS)(AdvantageInputs(
            rewards=rewards, group_ids=_group_ids(batch['uid']))).advantages
        shaped = shape_gathered(gepo, state, K, base[order], rewards[order].float(),
                                logprobs[order], mask[order]).advantages
        advantages = torch.empty_like(shaped)
        advantages[torch.tensor(order)] = shaped
        out.append(_result(advantages.tolist(), state))
    return out


def through_xtuner_v1(batches: list[dict[str, list]]) -> list[dict[str, Any]]:
    """XTuner v1's path: the step's groups of ``RolloutState``, the batch pass, then v1's
    per-group ``compute`` calls."""
    from xtuner.v1.data_proto.rl_data import RolloutState, Status

    from gepo_xtuner.integrations.xtuner_v1 import GEPOEstimator
    estimator = GEPOEstimator(eps=EPS, **SETTINGS)
    out = []
    for step, batch in enumerate(batches):
        states = [RolloutState(
            message=[{'role': 'user', 'content': uid}], prompt_ids=[1, 2, 3], response='text',
            response_ids=list(range(len(lps))), logprobs=lps, response_mask=mask,
            reward={'score': reward}, rollout_id=step * 1000 + i, status=Status.COMPLETED)
            for i, (uid, reward, lps, mask) in enumerate(zip(
                batch['uid'], batch['reward'], batch['logprobs'], batch['mask']))]
        groups: dict[str, list[int]] = {}
        for i, uid in enumerate(batch['uid']):
            groups.setdefault(uid, []).append(i)
        estimator.begin_step([[states[i] for i in rows] for rows in groups.values()])
        advantages = [0.0] * len(states)
        for rows in groups.values():
            group = [states[i] for i in rows]
            rewards = torch.tensor([s.reward['score'] for s in group])
            for i, a in zip(rows, estimator.compute(rewards, group).tolist()):
                advantages[i] = a
        estimator.end_step()
        out.append(_result(advantages, estimator.state))
    return out


def assert_same(path: str, got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """``got`` (a path's results) equals ``want`` (the core's): advantages to 1e-6, the band's
    thresholds to 1e-6 (relative above 1), its update count and settings exactly."""
    assert len(got) == len(want) == STEPS, path
    for step, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(torch.tensor(g['advantages']), torch.tensor(w['advantages']),
                                   rtol=0, atol=1e-6, msg=f'{path}, step {step}: advantages')
        assert g['band']['num_updates'] == w['band']['num_updates'] == step + 1, path
        assert g['band']['config'] == w['band']['config'], path
        for key in ('h_low', 'h_high'):
            assert abs(g['band'][key] - w['band'][key]) <= 1e-6 * max(1.0, abs(w['band'][key])), \
                f'{path}, step {step}: {key} {g["band"][key]} != {w["band"][key]}'


def check(path: str) -> None:
    """PATH on the batch, in this environment, against the core (raises if they differ)."""
    batches = make_batches()
    assert_same(path, PATHS[path](batches), through_core(batches))


PATHS = dict(core=through_core, slime=through_slime, verl=through_verl, trl=through_trl,
             xtuner_v1=through_xtuner_v1)
