"""GEPO on TRL's ``GRPOTrainer`` (TRL >= 1.16): a mixin and a ready trainer class.

TRL has no hook between its advantages and the loss; its maintainers' advice is to
subclass ``GRPOTrainer`` and override ``_generate_and_score_completions``, which is what
:class:`GEPOTrainerMixin` does. TRL computes the advantages of the step with its own
estimator (``scale_rewards``, ``multi_objective_aggregation``), over the rewards of the
whole generation batch gathered from every process, and keeps each process's slice.
The mixin then, on every process:

1. gathers the batch back in TRL's global order: the advantages, and the per-token
   logprobs of the sampling policy with their mask. Groups are ``num_generations``
   consecutive rows of that order (TRL's ``RepeatSampler``), so a group split between
   two processes is one group here;
2. shapes the advantages with this package's :class:`~gepo_xtuner.advantage.GEPOAdvantage`
   (TRL's advantages as the base, ``base_advantages``), its band updated once per
   generation batch and identical on every process (:func:`~gepo_xtuner.ops.distributed.replicated_batch`);
3. hands TRL its slice of the shaped advantages, and puts the shaped ones in TRL's
   completions table (``_logs['advantages']``) and ``gepo/*`` / ``shaping/*`` in its metrics.

Logprobs, in this order: the rollout engine's (``sampling_per_token_logps``, vLLM), the
trainer's under the sampling weights (``old_per_token_logps``), or, where TRL computes
neither (on-policy steps without vLLM), computed here with the model that has just
sampled (``_get_per_token_logps_and_entropies``, logits divided by the sampling
temperature, as TRL's own are). Tool-output tokens (``tool_mask``) are not counted.

The band is saved as ``gepo_state.json`` in each ``checkpoint-N/`` and restored by
``trainer.train(resume_from_checkpoint=...)``. Evaluation batches are not shaped and do
not move the band.

Example:
    >>> from trl import GRPOConfig
    >>> from gepo_xtuner.integrations.trl import GEPOGRPOTrainer
    >>> trainer = GEPOGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...),
    ...                           train_dataset=..., gepo=dict(alpha_low=0.5, alpha_high=0.2))
    >>> trainer.train()
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from torch import Tensor
from trl import GRPOTrainer

from ..advantage import AdvantageInputs, AdvantageOutput, EntropyThresholdState, GEPOAdvantage
from ..atomic_io import atomic_write_json
from ..ops.distributed import replicated_batch

__all__ = ['GEPOTrainerMixin', 'GEPOGRPOTrainer', 'STATE_FILE', 'shape_gathered']

#: The band's file in each of TRL's ``checkpoint-N/`` directories.
STATE_FILE = 'gepo_state.json'
#: Output keys of ``_generate_and_score_completions`` that the policy's forward takes.
_FORWARD_KEYS = ('pixel_values', 'image_grid_thw', 'pixel_attention_mask', 'spatial_shapes',
                 'image_sizes', 'token_type_ids', 'mm_token_type_ids', 'image_position_ids',
                 'num_images', 'num_tiles')


def _build_gepo(gepo: GEPOAdvantage | dict[str, Any] | None) -> GEPOAdvantage:
    if isinstance(gepo, GEPOAdvantage):
        return gepo
    kwargs = dict(gepo or {})
    if 'base' in kwargs or kwargs.get('type', 'GEPOAdvantage') != 'GEPOAdvantage':
        raise ValueError(
            'gepo: give GEPOAdvantage\'s own arguments (alpha_low, alpha_high, beta_low, '
            'beta_high, gamma); the base advantages are TRL\'s, set with GRPOConfig '
            f'(scale_rewards, multi_objective_aggregation), got {gepo!r}')
    kwargs.pop('type', None)
    return GEPOAdvantage(**kwargs)


def shape_gathered(gepo: GEPOAdvantage, state: EntropyThresholdState, num_generations: int,
                   advantages: Tensor, rewards: Tensor, logprobs: Tensor,
                   mask: Tensor) -> AdvantageOutput:
    """GEPO over TRL's gathered batch: every process calls it with the same tensors.

    Args:
        gepo: the processor; state: its band, updated once.
        num_generations: K; TRL's rows ``[g*K, (g+1)*K)`` are prompt g's completions.
        advantages: ``(N,)`` TRL's advantages (the base), in TRL's global order.
        rewards: ``(N,)`` TRL's weighted rewards (NaN counts as 0, as TRL sums them).
        logprobs: ``(N, C)`` the sampling policy's logprobs of the completion tokens.
        mask: ``(N, C)`` the completion tokens the policy generated.

    Returns:
        The processor's output; ``advantages`` are the shaped ``(N,)``.
    """
    cpu = torch.device('cpu')
    n = advantages.shape[0]
    batch = AdvantageInputs(
        rewards=torch.nan_to_num(rewards.to(cpu, torch.float64), nan=0.0),
        group_ids=torch.arange(n) // num_generations,
        logprobs=logprobs.to(cpu, torch.float32), mask=mask.to(cpu).bool())
    with replicated_batch():  # every process holds the whole batch
        return gepo(batch, state, base_advantages=advantages.to(cpu))


class GEPOTrainerMixin:
    """GEPO shaping of TRL's advantages; mix in before ``GRPOTrainer`` (see module).

    Args:
        gepo: :class:`~gepo_xtuner.advantage.GEPOAdvantage` or its keyword arguments
            (the paper's values by default). Its ``base`` is not used: TRL's advantages are.
        *args, **kwargs: ``GRPOTrainer``'s.

    Attributes:
        gepo: the processor.
        gepo_state: the band (:class:`~gepo_xtuner.advantage.EntropyThresholdState`).
    """

    def __init__(self, *args: Any, gepo: GEPOAdvantage | dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        self.gepo = _build_gepo(gepo)
        self.gepo_state: EntropyThresholdState = self.gepo.init_state()
        super().__init__(*args, **kwargs)
        self._gepo_rewards: Tensor | None = None

    # -- TRL's steps ------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's rewards of the whole batch ((N, F), gathered), kept for the shaping."""
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions,
                                                      completion_ids_list)
        self._gepo_rewards = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if not self.model.training:  # evaluation: TRL's advantages, the band untouched
            return out
        rewards_per_func, self._gepo_rewards = self._gepo_rewards, None
        local = out['advantages']
        if local.dim() != 1:
            raise RuntimeError(f'GEPO expects one advantage per completion, TRL gave shape '
                               f'{tuple(local.shape)}')
        acc = self.accelerator
        logprobs, mask = self._gepo_logprobs(out)
        adv_all = acc.gather(local.detach())
        logprobs_all = acc.gather(acc.pad_across_processes(logprobs, dim=1, pad_index=0))
        mask_all = acc.gather(acc.pad_across_processes(mask, dim=1, pad_index=0))
        n, k = adv_all.shape[0], self.num_generations
        if n % k or rewards_per_func is None or rewards_per_func.shape[0] != n:
            raise RuntimeError(
                f'the gathered batch has {n} completions and {k} per prompt '
                f'(rewards for {None if rewards_per_func is None else rewards_per_func.shape[0]}): '
                'GEPO needs whole groups in the order TRL normalised them')
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        shaped = shape_gathered(self.gepo, self.gepo_state, k, adv_all, rewards, logprobs_all,
                                mask_all)
        advantages = shaped.advantages.to(local.device, local.dtype)
        start = acc.process_index * local.shape[0]
        out['advantages'] = advantages[start:start + local.shape[0]]
        self._gepo_log(advantages, shaped.metrics)
        return out

    def _gepo_logprobs(self, out: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """``(B, C)`` sampled-token logprobs of this process's completions under the
        sampling policy, and the mask of the tokens the policy generated."""
        mask = out['completion_mask']
        if out.get('tool_mask') is not None:
            mask = mask * out['tool_mask']
        sampled = out.get('sampling_per_token_logps')
        if sampled is not None and bool(torch.isfinite(sampled[mask.bool()]).all()):
            return sampled.float(), mask
        old = out.get('old_per_token_logps')
        if old is not None:
            return old.float(), mask
        prompt_ids, completion_ids = out['prompt_ids'], out['completion_ids']
        forward = {key: out[key] for key in _FORWARD_KEYS if key in out}
        with torch.no_grad():
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, torch.cat([prompt_ids, completion_ids], dim=1),
                torch.cat([out['prompt_mask'], out['completion_mask']], dim=1),
                completion_ids.size(1), batch_size=self.args.per_device_train_batch_size,
                **forward)
        return logps.float(), mask

    def _gepo_log(self, advantages: Tensor, metrics: dict[str, float]) -> None:
        """The shaped advantages into TRL's completions table, GEPO's figures into its
        metrics (averaged by TRL over each logging interval)."""
        logged = self._logs['advantages']
        for _ in range(min(advantages.numel(), len(logged))):
            logged.pop()  # TRL's own, appended by the step just run
        logged.extend(advantages.tolist())
        for key, value in metrics.items():
            if key.startswith(('gepo/', 'shaping/')) and key.count('/') == 1:
                self._metrics['train'][key].append(float(value))

    # -- checkpoints ------------------------------------------------------------------
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
            folder = os.path.join(self._get_output_dir(trial=trial),
                                  f'{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}')
            atomic_write_json(os.path.join(folder, STATE_FILE), self.gepo_state.state_dict())

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, STATE_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f'{checkpoint} has no {STATE_FILE}: it was not written by a GEPO trainer, and '
                'resuming would restart the entropy band from the next batch; start a new '
                'run from its weights (model=...) instead of resume_from_checkpoint')
        with open(path, encoding='utf-8') as f:
            self.gepo_state.load_state_dict(json.load(f))


class GEPOGRPOTrainer(GEPOTrainerMixin, GRPOTrainer):
    """TRL's ``GRPOTrainer`` with GEPO shaping (:class:`GEPOTrainerMixin`).

    Args:
        gepo: :class:`~gepo_xtuner.advantage.GEPOAdvantage` or its keyword arguments.
        *args, **kwargs: ``GRPOTrainer``'s.
    """
