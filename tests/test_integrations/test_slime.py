"""GEPO as slime's reward post-process function (gepo_xtuner.integrations.slime).

slime is not on PyPI and needs SGLang and Megatron on GPUs, so these tests call the
function as slime's rollout manager does (``fn(args, samples)``, once per rollout) with
stand-ins for slime's ``Sample`` and parsed arguments that carry the fields slime defines
(slime/utils/types.py ``Sample``: ``group_index``, ``index``, ``reward``,
``rollout_log_probs``, ``loss_mask``, ``remove_sample``; slime/utils/arguments.py:
``advantage_estimator``, ``rewards_normalization``, ``grpo_std_normalization``,
``n_samples_per_prompt``, ``reward_key``, ``save``, ``load``, ``start_rollout_id``).
"""

import json
import random
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from gepo_xtuner.advantage import AdvantageInputs, GEPOAdvantage, GRPOAdvantage
from gepo_xtuner.integrations import slime
from gepo_xtuner.integrations.slime import BAND_FILE, GEPOPostProcess

GEPO = dict(alpha_low=0.5, alpha_high=0.2, beta_low=0.2, beta_high=0.3, gamma=0.3)


@dataclass
class SlimeSample:
    """Stand-in for slime's ``Sample`` (the fields the post-process function reads)."""

    group_index: int | None = None
    index: int | None = None
    reward: float | dict[str, Any] | None = None
    rollout_log_probs: list[float] | None = None
    loss_mask: list[int] | None = None
    remove_sample: bool = False
    response_length: int = 0
    metadata: dict = field(default_factory=dict)


def slime_args(**overrides: Any) -> SimpleNamespace:
    """slime's defaults for the fields read (GRPO with std normalisation)."""
    base = dict(advantage_estimator='grpo', rewards_normalization=True,
                grpo_std_normalization=True, n_samples_per_prompt=4, reward_key=None, save=None,
                load=None, start_rollout_id=None)
    return SimpleNamespace(**{**base, **overrides})


def rollout(seed: int, groups: int = 6, k: int = 4) -> list[SlimeSample]:
    """A rollout: groups of k samples with rewards in {0, 0.5, 1}, logprobs whose scale
    differs by group (so the group entropies spread and the band shapes some groups),
    and tool tokens (loss_mask 0) in some responses."""
    rng = random.Random(seed)
    samples = []
    for g in range(groups):
        scale = 0.2 + 0.4 * g
        for i in range(k):
            n = rng.randint(2, 9)
            mask = [1] * n
            if rng.random() < 0.3:
                mask[rng.randrange(n)] = 0
            samples.append(SlimeSample(
                group_index=g, index=g * k + i, reward=rng.choice([0.0, 0.5, 1.0]),
                rollout_log_probs=[-scale * rng.random() * 3 for _ in range(n)], loss_mask=mask,
                response_length=n))
    return samples


def core(samples: list[SlimeSample], gepo: GEPOAdvantage, state) -> torch.Tensor:
    """The same rollout through this package's core, built independently of the adapter."""
    lps = [[lp for lp, m in zip(s.rollout_log_probs, s.loss_mask) if m] for s in samples]
    width = max(map(len, lps))
    logprobs = torch.tensor([lp + [0.0] * (width - len(lp)) for lp in lps])
    mask = torch.tensor([[True] * len(lp) + [False] * (width - len(lp)) for lp in lps])
    batch = AdvantageInputs(rewards=torch.tensor([s.reward for s in samples], dtype=torch.float64),
                            group_ids=torch.tensor([s.group_index for s in samples]),
                            logprobs=logprobs, mask=mask)
    gepo.base = GRPOAdvantage(eps=1e-6)  # slime's guard
    return gepo(batch, state).advantages


def test_every_rollout_gets_the_cores_shaping_and_band():
    """Three rollouts: the returned advantages are the core's GEPO over GRPO (slime's
    normalisation, eps 1e-6) and the band equals the core's after each."""
    fn = GEPOPostProcess(**GEPO)
    reference = GEPOAdvantage(**GEPO)
    state = reference.init_state()
    shaped = 0
    for seed in range(3):
        samples = rollout(seed)
        raw, rewards = fn(slime_args(), samples)
        assert raw == [s.reward for s in samples]
        expected = core(samples, reference, state)
        torch.testing.assert_close(torch.tensor(rewards), expected, atol=1e-6, rtol=0)
        assert fn.state.state_dict() == state.state_dict()
        shaped += int(fn.last.damped_positive.sum() + fn.last.damped_negative.sum())
    assert shaped > 0


def test_groups_follow_group_index_in_any_order():
    samples = rollout(7)
    order = list(range(len(samples)))
    random.Random(1).shuffle(order)
    _, straight = GEPOPostProcess(**GEPO)(slime_args(), samples)
    _, shuffled = GEPOPostProcess(**GEPO)(slime_args(), [samples[i] for i in order])
    assert shuffled == pytest.approx([straight[i] for i in order], abs=1e-12)


def test_without_group_index_groups_are_consecutive_samples():
    samples = rollout(3)
    _, indexed = GEPOPostProcess(**GEPO)(slime_args(), samples)
    for s in samples:
        s.group_index = None
    _, consecutive = GEPOPostProcess(**GEPO)(slime_args(n_samples_per_prompt=4), samples)
    assert consecutive == indexed
    with pytest.raises(ValueError, match='not whole groups of --n-samples-per-prompt 5'):
        GEPOPostProcess(**GEPO)(slime_args(n_samples_per_prompt=5), samples)


def test_tool_tokens_and_removed_samples_are_not_measured():
    """Tokens with loss_mask 0 and samples slime removes carry no entropy: changing their
    logprobs changes nothing."""
    samples = rollout(5)
    _, before = GEPOPostProcess(**GEPO)(slime_args(), samples)
    for s in samples:
        s.rollout_log_probs = [lp if m else -50.0 for lp, m in zip(s.rollout_log_probs,
                                                                     s.loss_mask)]
    samples[0].remove_sample = True
    kept = GEPOPostProcess(**GEPO)
    _, after_mask = kept(slime_args(), samples)
    samples[0].rollout_log_probs = [-50.0] * len(samples[0].rollout_log_probs)
    _, after_remove = GEPOPostProcess(**GEPO)(slime_args(), samples)
    assert after_remove == after_mask
    assert any(s.loss_mask.count(0) for s in samples)


def test_resume_loads_the_band_of_the_checkpoint(tmp_path):
    """A run saving to SAVE is cut after 3 rollouts; a new process resumed at rollout 2
    (the checkpoint of iteration 2) continues with the band after 2 rollouts, bit for bit."""
    args = slime_args(save=str(tmp_path))
    straight = GEPOPostProcess(**GEPO)
    results = [straight(args, rollout(seed)) for seed in range(4)]
    lines = (tmp_path / BAND_FILE).read_text().splitlines()
    assert [json.loads(line)['num_updates'] for line in lines] == [1, 2, 3, 4]
    resumed = GEPOPostProcess(**GEPO)
    again = [resumed(slime_args(save=str(tmp_path), load=str(tmp_path), start_rollout_id=2),
                     rollout(seed)) for seed in (2, 3)]
    assert again == results[2:]
    missing = GEPOPostProcess(**GEPO)
    with pytest.raises(FileNotFoundError, match='needs the GEPO band after 9 rollouts'):
        missing(slime_args(load=str(tmp_path), start_rollout_id=9), rollout(0))


def test_settings_whose_advantages_are_not_the_rewards_are_refused():
    for args in (slime_args(advantage_estimator='ppo'), slime_args(rewards_normalization=False)):
        with pytest.raises(ValueError, match='GEPO shapes group-normalised advantages'):
            GEPOPostProcess(**GEPO)(args, rollout(0))
    samples = rollout(0)
    samples[3].rollout_log_probs = None
    with pytest.raises(ValueError, match='sample 3 \\(group 0\\) has no rollout_log_probs'):
        GEPOPostProcess(**GEPO)(slime_args(), samples)


def test_the_module_function_reads_gepo_settings_from_the_environment(monkeypatch):
    monkeypatch.setattr(slime, '_PROCESSOR', None)
    monkeypatch.setenv('GEPO_ALPHA_LOW', '0.25')
    monkeypatch.setenv('GEPO_GAMMA', '0.5')
    slime.post_process_rewards(slime_args(), rollout(0))
    p = slime._PROCESSOR.gepo
    assert (p.alpha_low, p.gamma, p.alpha_high) == (0.25, 0.5, 0.2)
