"""GEPO for slime: a reward post-process function (``--custom-reward-post-process-path``).

slime (THUDM/slime; not on PyPI) calls the function given by
``--custom-reward-post-process-path`` once per rollout, in its rollout manager, with every
sample of the rollout: ``fn(args, samples) -> (raw_rewards, rewards)``. What it returns
replaces slime's own group normalisation, and for the GRPO family
(``--advantage-estimator grpo|gspo|cispo|reinforce_plus_plus_baseline``) slime's advantage of
every response token is that response's value, so shaping here is GEPO's shaping of the
advantages. :func:`post_process_rewards` does, over the whole rollout:

1. the normalisation slime would have done (per prompt group: the mean removed, divided by
   ``std + 1e-6`` (Bessel) when ``--grpo-std-normalization`` is on for grpo/gspo/cispo), with
   this package's estimators (``GRPOAdvantage(eps=1e-6)`` or ``DrGRPOAdvantage``) in float64;
2. GEPO with the group entropy of each group from the rollout engine's logprobs of its
   trained tokens (``sample.rollout_log_probs`` where ``sample.loss_mask`` is 1), one band
   update per rollout.

Groups are the samples that share ``sample.group_index`` (the prompt), wherever they sit in
the list; without it, ``--n-samples-per-prompt`` consecutive samples.

The band is kept by the :class:`GEPOPostProcess` instance (slime loads the function once per
rollout manager) and, with ``--save``, written after every rollout to ``SAVE/gepo_band.jsonl``, one line per
rollout: ``{"num_updates": n, "state": {...}}``. On the first call after a resume
(``--load`` with ``args.start_rollout_id = n``), the line with ``num_updates == n`` is loaded
from ``LOAD/gepo_band.jsonl``: the band as it was after rollout ``n - 1``, which the
checkpoint of iteration ``n`` goes with.

slime's argument parser has no room for GEPO's settings: give slime an instance made in a
module of your own (``post_process_rewards = GEPOPostProcess(alpha_low=..., gamma=...)``,
then ``--custom-reward-post-process-path my_module.post_process_rewards``), or use
:func:`post_process_rewards`, which reads ``GEPO_ALPHA_LOW``, ``GEPO_ALPHA_HIGH``,
``GEPO_BETA_LOW``, ``GEPO_BETA_HIGH`` and ``GEPO_GAMMA`` from the environment (the paper's
values by default).

Tested against slime's documented contract (its ``Sample`` fields and the call above), not
against a slime installation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..advantage import (AdvantageInputs, AdvantageOutput, DrGRPOAdvantage, EntropyThresholdState,
                         GEPOAdvantage, GRPOAdvantage)
from ..atomic_io import atomic_write_bytes
from ..ops.ragged import pad_ragged

__all__ = ['GEPOPostProcess', 'post_process_rewards', 'BAND_FILE']

#: The band's history in slime's ``--save`` / ``--load`` directory.
BAND_FILE = 'gepo_band.jsonl'
#: slime's estimators whose advantages are the post-processed rewards of the response
GROUP_ESTIMATORS = ('grpo', 'gspo', 'cispo', 'reinforce_plus_plus_baseline')
_ENV = dict(alpha_low='GEPO_ALPHA_LOW', alpha_high='GEPO_ALPHA_HIGH', beta_low='GEPO_BETA_LOW',
            beta_high='GEPO_BETA_HIGH', gamma='GEPO_GAMMA')


def _reward(args: Any, sample: Any) -> float:
    key = getattr(args, 'reward_key', None)
    value = sample.reward[key] if key else sample.reward
    if value is None:
        raise ValueError(f'sample {sample.index} (group {sample.group_index}) has no reward: '
                         'GEPO post-processes scored samples')
    return float(value)


def _trained_logprobs(sample: Any) -> list[float]:
    """Rollout logprobs of the response tokens slime trains on."""
    if sample.rollout_log_probs is None:
        raise ValueError(
            f'sample {sample.index} (group {sample.group_index}) has no rollout_log_probs: '
            'GEPO measures group entropy from the rollout engine\'s logprobs of the sampled '
            'tokens; keep them in the rollout (slime fills them from SGLang\'s output)')
    if getattr(sample, 'remove_sample', False):
        return []
    mask = sample.loss_mask
    logprobs = list(sample.rollout_log_probs)
    if mask is None:
        return logprobs
    if len(mask) != len(logprobs):
        raise ValueError(f'sample {sample.index}: loss_mask has {len(mask)} entries and '
                         f'rollout_log_probs {len(logprobs)}')
    return [lp for lp, m in zip(logprobs, mask) if m]


class GEPOPostProcess:
    """slime's reward post-processing with GEPO shaping (see module).

    Args:
        **gepo: :class:`~gepo_xtuner.advantage.GEPOAdvantage`'s arguments.

    Attributes:
        gepo: the processor; state: its band.
    """

    def __init__(self, **gepo: float) -> None:
        self.gepo = GEPOAdvantage(**gepo)
        self.state: EntropyThresholdState = self.gepo.init_state()
        self._restored = False
        self.last: AdvantageOutput | None = None

    def batch(self, args: Any, samples: Sequence[Any]) -> tuple[AdvantageInputs, Any]:
        """The rollout as the core's batch, and the estimator slime's settings ask for.

        Raises:
            ValueError: settings whose advantages are not the returned values, or samples
                without what GEPO reads.
        """
        estimator = getattr(args, 'advantage_estimator', 'grpo')
        if estimator not in GROUP_ESTIMATORS or not getattr(args, 'rewards_normalization', True):
            raise ValueError(
                f'GEPO shapes group-normalised advantages: slime uses the post-processed rewards '
                f'as advantages for --advantage-estimator {"/".join(GROUP_ESTIMATORS)} with '
                f'reward normalisation on; this run has {estimator!r}, rewards_normalization='
                f'{getattr(args, "rewards_normalization", True)}')
        if not samples:
            raise ValueError('the rollout has no samples')
        if all(s.group_index is not None for s in samples):
            keys = [s.group_index for s in samples]
        else:
            n = int(getattr(args, 'n_samples_per_prompt', 1))
            if len(samples) % n:
                raise ValueError(f'{len(samples)} samples without group_index are not whole '
                                 f'groups of --n-samples-per-prompt {n}')
            keys = [i // n for i in range(len(samples))]
        group_ids = torch.tensor([{k: i for i, k in enumerate(dict.fromkeys(keys))}[k]
                                  for k in keys])
        logprobs, mask = pad_ragged([_trained_logprobs(s) for s in samples])
        rewards = torch.tensor([_reward(args, s) for s in samples], dtype=torch.float64)
        std = estimator in ('grpo', 'gspo', 'cispo') and getattr(args, 'grpo_std_normalization',
                                                                True)
        base = GRPOAdvantage(eps=1e-6) if std else DrGRPOAdvantage()
        return AdvantageInputs(rewards=rewards, group_ids=group_ids, logprobs=logprobs,
                               mask=mask), base

    def __call__(self, args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
        """``(raw_rewards, rewards)`` for slime; the band is updated once."""
        if not self._restored:
            self._restore(args)
        batch, base = self.batch(args, samples)
        raw = base(batch).advantages
        self.last = self.gepo(batch, self.state, base_advantages=raw.double())
        self._save(args)
        return batch.rewards.tolist(), self.last.advantages.tolist()

    # -- the band across a resume ------------------------------------------------------
    def _restore(self, args: Any) -> None:
        self._restored = True
        load, start = getattr(args, 'load', None), getattr(args, 'start_rollout_id', None)
        if not load or not start:
            return
        path = Path(load) / BAND_FILE
        lines = path.read_text(encoding='utf-8').splitlines() if path.is_file() else []
        for line in reversed(lines):  # the last entry: a crashed run's later lines are stale
            entry = json.loads(line)
            if entry['num_updates'] == start:
                self.state.load_state_dict(entry['state'])
                return
        raise FileNotFoundError(
            f'resuming at rollout {start} needs the GEPO band after {start} rollouts, which '
            f'{path} does not hold ({len(lines)} entries): without it the band would restart')

    def _save(self, args: Any) -> None:
        save = getattr(args, 'save', None)
        if not save:
            return
        path = Path(save) / BAND_FILE
        line = json.dumps(dict(num_updates=self.state.num_updates,
                               state=self.state.state_dict())) + '\n'
        # One line per rollout, appended by rewriting the file atomically: an in-place
        # append cut short (a kill, a full disk) would leave a partial last line, which
        # _restore reads first and cannot parse. The file stays small (~150 bytes a rollout).
        old = path.read_bytes() if path.is_file() else b''
        atomic_write_bytes(path, old + line.encode('utf-8'))


_PROCESSOR: GEPOPostProcess | None = None


def post_process_rewards(args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """slime's ``--custom-reward-post-process-path gepo_xtuner.integrations.slime.post_process_rewards``.

    Args:
        args: slime's parsed arguments (``advantage_estimator``, ``rewards_normalization``,
            ``grpo_std_normalization``, ``n_samples_per_prompt``, ``reward_key``, ``save``,
            ``load``, ``start_rollout_id``).
        samples: the rollout's samples (``group_index``, ``reward``, ``rollout_log_probs``,
            ``loss_mask``, ``remove_sample``).

    Returns:
        ``(raw_rewards, rewards)``: the rewards, and the GEPO-shaped group-normalised
        advantages slime trains on, one per sample in the given order.
    """
    global _PROCESSOR
    if _PROCESSOR is None:
        _PROCESSOR = GEPOPostProcess(**{name: float(os.environ[var]) for name, var in _ENV.items()
                                       if var in os.environ})
    return _PROCESSOR(args, samples)
