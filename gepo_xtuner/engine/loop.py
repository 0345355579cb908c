"""The RL step as an mmengine train loop: rollout -> reward -> advantage -> updates -> sync."""

import time
from collections import defaultdict
from typing import Any

import torch
from mmengine.model import is_model_wrapper
from mmengine.registry import LOOPS
from mmengine.runner.base_loop import BaseLoop
from mmengine.runner.loops import _InfiniteDataloaderIterator

from ..advantage import RolloutBatch, encode_domains
from ..ops.multimodal import mm_to, placeholder_token_ids
from ..registry import ADVANTAGES, ROLLOUT_BACKENDS
from ..reward import RewardRouter
from ..rollout import RolloutRequest, SamplingParams
from .batching import ResponseBatch, build_response_batch, cut_at_tokens, minibatches
from .loop_state_hook import RLLoopStateHook
from .requests import encode_request, prompt_token_ids
from .validation import Validator


@LOOPS.register_module()
class RLTrainLoop(BaseLoop):
    """Online RL with group-relative advantages (GRPO, GEPO, ...) for ``xtuner train``.

    One loop iteration is one RL step:

    1. take B prompts (this rank's batch from ``train_dataloader``);
    2. sample K responses each from the rollout backend;
    3. score them with the domain's reward function;
    4. compute old-policy logprobs (one no-grad forward; they give the importance
       ratio's denominator AND the group entropy, so GEPO costs no extra pass);
    5. advantages from the configured processor (its state, e.g. GEPO's
       thresholds, is owned and checkpointed by :class:`GEPOThresholdHook`);
    6. ``ppo_epochs`` passes over the B*K responses in shuffled minibatches of
       ``minibatch_size``: one optimizer step each, with the model's policy loss;
    7. hand the new weights to the rollout backend.

    Metrics of the step go to the runner as the iteration's outputs (logged by
    mmengine's LoggerHook and visualizer backends as ``train/<name>``).

    Args:
        runner: the mmengine runner.
        dataloader: prompt dataloader config; its ``batch_size`` is B per rank and
            its ``collate_fn`` must keep records as a list of dicts
            (``list_collate``).
        max_steps: RL steps to run.
        rollout: rollout-backend config (:data:`~gepo_xtuner.registry.ROLLOUT_BACKENDS`).
        advantage: advantage-processor config (:data:`~gepo_xtuner.registry.ADVANTAGES`).
        rewards: domain -> reward config, see :class:`~gepo_xtuner.reward.RewardRouter`.
        num_responses: K, responses per prompt.
        sampling: :class:`~gepo_xtuner.rollout.SamplingParams` fields except ``n``;
            ``stop_token_ids`` defaults to the tokenizer's EOS.
        prompt_template: ``str.format`` template applied to each record's ``prompt``
            (records with chat ``messages`` use the tokenizer's chat template instead).
            Records with ``images`` go through the policy's processor, see
            :mod:`gepo_xtuner.engine.requests` and ``docs/multimodal.md``.
        minibatch_size: responses per optimizer step and rank (the paper's minibatch
            of 32 prompts x K=16 is 512 responses over all ranks).
        micro_batch_size: responses per forward/backward inside a minibatch; the
            optimizer wrapper's ``accumulative_counts`` must equal
            ``minibatch_size // micro_batch_size``. Defaults to ``minibatch_size``.
        ppo_epochs: passes over each rollout batch.
        logprob_batch_size: responses per no-grad forward for old logprobs.
        val: optional :class:`~gepo_xtuner.engine.validation.Validator` arguments:
            ``dict(path=..., interval=...)`` (one held-out file, logged per domain as
            ``val/<domain>/acc``) and/or ``benchmarks=[dict(name=..., path=..., n=...,
            temperature=...), ...]`` (logged as ``val/<name>/acc``), validated before
            the first step, every ``interval`` steps and after the last, with the
            step's metrics (so checkpoints carry it too).
        reward_route_by: the record field that picks the reward function,
            ``'domain'`` (default) or ``'data_source'``.
    """

    def __init__(self, runner, dataloader: Any, max_steps: int, rollout: dict, advantage: dict,
                 rewards: dict, num_responses: int = 8, sampling: dict | None = None,
                 prompt_template: str = '{prompt}', minibatch_size: int = 32,
                 micro_batch_size: int | None = None, ppo_epochs: int = 1,
                 logprob_batch_size: int = 64, val: dict | None = None,
                 reward_route_by: str = 'domain') -> None:
        super().__init__(runner, dataloader)
        if max_steps < 1 or num_responses < 1 or minibatch_size < 1 or ppo_epochs < 1:
            raise ValueError('RLTrainLoop needs max_steps, num_responses, minibatch_size and '
                             f'ppo_epochs >= 1, got {max_steps}, {num_responses}, '
                             f'{minibatch_size}, {ppo_epochs}')
        self.micro_batch_size = micro_batch_size or minibatch_size
        if minibatch_size % self.micro_batch_size:
            raise ValueError(f'minibatch_size ({minibatch_size}) must be a multiple of '
                             f'micro_batch_size ({self.micro_batch_size})')
        self._max_iters = max_steps
        self._max_epochs = 1
        self._epoch = 0
        self._iter = 0
        self.minibatch_size = minibatch_size
        self.ppo_epochs = ppo_epochs
        self.logprob_batch_size = logprob_batch_size
        self.prompt_template = prompt_template
        self.advantage = ADVANTAGES.build(advantage)
        self.advantage_state: Any = None  # handed over by GEPOThresholdHook
        self.rollout = ROLLOUT_BACKENDS.build(rollout)
        self.rewards = RewardRouter(rewards, route_by=reward_route_by)
        self._sampling_cfg = dict(sampling or {}, n=num_responses)
        self.sampling: SamplingParams | None = None
        self._placeholders: tuple[int, ...] = ()  # the policy's image placeholder tokens
        self.validator = Validator(**val) if val else None
        self.history: list[dict[str, float]] = []  # per-step metrics, checkpointed
        self.dataloader_iterator = _InfiniteDataloaderIterator(self.dataloader)
        if not any(isinstance(h, RLLoopStateHook) for h in runner.hooks):
            runner.register_hook(RLLoopStateHook(), priority='VERY_LOW')

    @property
    def max_epochs(self) -> int:
        return self._max_epochs

    @property
    def max_iters(self) -> int:
        return self._max_iters

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def iter(self) -> int:
        return self._iter

    @property
    def policy(self):
        model = self.runner.model
        return model.module if is_model_wrapper(model) else model

    def run(self) -> torch.nn.Module:
        """Runs the remaining RL steps (after ``--resume``, from the saved step)."""
        self.runner.call_hook('before_train')
        policy = self.policy
        tokenizer = policy.tokenizer
        self.rollout.attach(policy.llm, tokenizer)
        self._placeholders = placeholder_token_ids(getattr(policy.llm, 'config', None))
        cfg = dict(self._sampling_cfg)
        cfg.setdefault('stop_token_ids', (tokenizer.eos_token_id, ))
        self.sampling = SamplingParams(**{**cfg, 'stop_token_ids': tuple(cfg['stop_token_ids'])})
        if self.advantage.init_state() is not None and self.advantage_state is None:
            raise RuntimeError(f'{type(self.advantage).__name__} keeps state across steps; add '
                               "dict(type='GEPOThresholdHook') to custom_hooks so that it is "
                               'owned and checkpointed')
        for _ in range(self._iter):  # resume: skip the prompts already used
            next(self.dataloader_iterator)
        RLLoopStateHook.restore_rng(self)
        if self.validator is not None and self._iter == 0:  # the starting point
            metrics = self.validator.run(self)
            self.runner.visualizer.add_scalars(metrics, step=0)
            self.history.append(dict(step=0.0, **metrics))
            self._log_validation(0, metrics)
        # one "epoch" spans the run, as in mmengine's iteration-based loop
        self.runner.call_hook('before_train_epoch')
        while self._iter < self._max_iters:
            self.run_iter(next(self.dataloader_iterator))
        self.runner.call_hook('after_train_epoch')
        self.runner.call_hook('after_train')
        self.rollout.close()  # e.g. stops an LMDeploy server the backend launched
        return self.runner.model

    def encode_requests(self, records: list[dict]) -> list[RolloutRequest]:
        """Rollout requests for ``records``: token ids, and for records with images the
        images and the processor's inputs (:func:`~gepo_xtuner.engine.requests.encode_request`).
        """
        policy = self.policy
        processor = getattr(policy, 'processor', None)
        return [encode_request(r, policy.tokenizer, processor, self.prompt_template)
                for r in records]

    def _tokenize(self, records: list[dict]) -> list[list[int]]:
        """Prompt token ids as servers take them (one placeholder token per image)."""
        policy = self.policy
        processor = getattr(policy, 'processor', None)
        return [prompt_token_ids(r, policy.tokenizer, processor, self.prompt_template)
                for r in records]

    def run_iter(self, records: list[dict]) -> None:
        """One RL step on this rank's ``records`` (B prompt records)."""
        self.runner.call_hook('before_train_iter', batch_idx=self._iter, data_batch=records)
        times: dict[str, float] = {}
        t = time.perf_counter()
        requests = self.encode_requests(records)
        samples = self.rollout.generate(requests, self.sampling)
        if self._placeholders:  # a VLM cannot score responses holding image slots
            samples = cut_at_tokens(samples, self._placeholders)
        times['rollout'] = time.perf_counter() - t

        t = time.perf_counter()
        tok = self.policy.tokenizer
        mm = [r.mm_inputs or {} for r in requests]  # per prompt; rows gather their own
        batch = build_response_batch([r.prompt_ids for r in requests], samples,
                                     tok.pad_token_id, mm if any(mm) else None)
        flat_records = [records[g] for g in batch.group_index.tolist()]
        texts = tok.batch_decode([s.response_ids for group in samples for s in group],
                                 skip_special_tokens=True)
        rewards, metrics = self.rewards(texts, flat_records)
        times['reward'] = time.perf_counter() - t

        t = time.perf_counter()
        old_logprobs, entropy = self._old_logprobs(batch)
        domain_ids, names = encode_domains([r['domain'] for r in flat_records])
        adv = self.advantage(
            RolloutBatch(rewards=rewards, group_ids=batch.group_index, logprobs=old_logprobs,
                         mask=batch.response_mask, domain_ids=domain_ids, domain_names=names,
                         prompt_ids=[r['id'] for r in flat_records]), self.advantage_state)
        metrics.update(adv.metrics)
        metrics.update(self._entropy_metrics(batch, old_logprobs, entropy, domain_ids, names))
        times['advantage'] = time.perf_counter() - t

        t = time.perf_counter()
        metrics.update(self._update(batch, old_logprobs, adv.advantages))
        times['update'] = time.perf_counter() - t

        t = time.perf_counter()
        self.rollout.update_weights(self.policy.llm)
        times['sync'] = time.perf_counter() - t

        step = self._iter + 1
        if self.validator is not None and (step % self.validator.interval == 0
                                           or step == self._max_iters):
            t = time.perf_counter()
            val = self.validator.run(self)
            times['validation'] = time.perf_counter() - t
            metrics.update(val)
            self._log_validation(step, val)

        new_tokens = int(batch.response_mask.sum())
        metrics['perf/gen_tokens'] = float(new_tokens)
        metrics['perf/gen_tokens_per_sec'] = new_tokens / max(times['rollout'], 1e-9)
        metrics.update({f'time/{k}': v for k, v in times.items()})
        metrics['time/step'] = sum(v for k, v in times.items() if k != 'validation')
        self.history.append(dict(step=float(step), **metrics))
        self.runner.call_hook('after_train_iter', batch_idx=self._iter, data_batch=records,
                              outputs=metrics)
        self._iter += 1

    @torch.no_grad()
    def _old_logprobs(self, batch: ResponseBatch) -> tuple[torch.Tensor, torch.Tensor]:
        policy = self.policy
        device = next(policy.parameters()).device
        logprobs, entropies = [], []
        for start in range(0, len(batch), self.logprob_batch_size):
            inputs = {k: getattr(batch, k)[start:start + self.logprob_batch_size].to(device)
                      for k in ('input_ids', 'attention_mask', 'response_mask')}
            if batch.mm_inputs is not None:  # the rows' images: the context rollouts saw
                rows = torch.arange(start, start + len(inputs['input_ids']))
                inputs['mm_inputs'] = mm_to(batch.multimodal_inputs(rows), device)
            lp, ent = policy(inputs=inputs, mode='logprobs')
            logprobs.append(lp.float().cpu())
            entropies.append(ent.float().cpu())
        return torch.cat(logprobs), torch.cat(entropies)

    @staticmethod
    def _entropy_metrics(batch: ResponseBatch, old_logprobs: torch.Tensor,
                         entropy: torch.Tensor, domain_ids: torch.Tensor,
                         names: list[str]) -> dict[str, float]:
        mask = batch.response_mask
        tokens = mask.sum(1).clamp_min(1)
        per_seq = torch.where(mask, entropy, 0).sum(1) / tokens  # full-vocabulary entropy
        metrics = {'entropy/policy': float(per_seq.mean()),
                   'rollout/logprob_abs_diff': float(
                       torch.where(mask, (old_logprobs - batch.rollout_logprobs).abs(), 0).sum()
                       / mask.sum().clamp_min(1))}
        for d, name in enumerate(names):
            metrics[f'entropy/policy/{name}'] = float(per_seq[domain_ids == d].mean())
        return metrics

    def _update(self, batch: ResponseBatch, old_logprobs: torch.Tensor,
                advantages: torch.Tensor) -> dict[str, float]:
        runner = self.runner
        n_micro = self.minibatch_size // self.micro_batch_size
        sums: dict[str, float] = defaultdict(float)
        steps = 0
        for _ in range(self.ppo_epochs):
            for index in minibatches(len(batch), self.minibatch_size):
                # micro-batch losses are normalised by the whole minibatch, then the
                # optimizer wrapper divides by accumulative_counts (= n_micro)
                rows = batch.response_mask[index]
                n_tokens = float(rows.sum()) / n_micro
                n_seqs = float(rows.any(1).sum()) / n_micro
                for micro in index.split(self.micro_batch_size):
                    part = batch.rows(micro)
                    width = part.response_width
                    inputs = dict(input_ids=part.input_ids, attention_mask=part.attention_mask,
                                  response_mask=part.response_mask,
                                  old_logprobs=old_logprobs[micro, :width],
                                  advantages=advantages[micro],
                                  num_tokens=torch.tensor(n_tokens),
                                  num_seqs=torch.tensor(n_seqs))
                    if part.mm_inputs is not None:
                        inputs['mm_inputs'] = part.multimodal_inputs()
                    log_vars = runner.model.train_step(dict(inputs=inputs),
                                                       optim_wrapper=runner.optim_wrapper)
                    for key, value in log_vars.items():
                        sums[key] += float(value)
                    steps += 1
        return {(k if k.startswith(('loss', 'ratio')) else f'loss/{k}'): v / steps
                for k, v in sums.items()}

    def _log_validation(self, step: int, metrics: dict[str, float]) -> None:
        shown = '  '.join(f'{k}={v:.3f}' for k, v in sorted(metrics.items()))
        self.runner.logger.info(f'Validation at step {step}: {shown}')
