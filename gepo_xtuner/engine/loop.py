"""The RL step as an mmengine train loop: rollout -> reward -> advantage -> updates -> sync."""

import logging
import math
import time
from collections.abc import Iterable
from typing import Any

import torch
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import LOOPS
from mmengine.runner.base_loop import BaseLoop
from mmengine.runner.loops import _InfiniteDataloaderIterator

from ..advantage import AdvantageInputs, encode_domains
from ..advantage.base import BAND_KEYS
from ..ops.distributed import dist_world_size
from ..ops.multimodal import placeholder_token_ids
from ..registry import ADVANTAGES, ROLLOUT_BACKENDS
from ..reward import RewardRouter
from ..rollout import RolloutRequest, SamplingParams
from .runtime.logging import StageClock
from .state.loop_state_hook import RLLoopStateHook
from .state.run_state import (capture_rng, describe_changes, gather_rank_states, isolated_rng,
                              restore_processor_state, resume_streams, run_settings,
                              saved_rank_entry)
from .step.batching import Rollouts, build_response_batch, cut_at_tokens
from .step.geometry import check_group_size, warn_step_geometry
from .step.optim_step import check_accumulation
from .step.prompt_encoding import check_policy_inputs, encode_request
from .step.rollout_stage import build_rollout_stage
from .step.update import NoSignalWatch, entropy_metrics, ppo_update
from .step.update import old_logprobs as old_logprobs_of
from .step.validation import Validator
from .train_cfg import TrainCfg


@LOOPS.register_module()
class RLTrainLoop(BaseLoop):
    """Online RL with group-relative advantages (GRPO, GEPO, ...) for ``xtuner train``.

    One loop iteration is one RL step on B prompts (this rank's batch of
    ``train_dataloader``), five stages of one call each (:meth:`run_iter`):

    1. rollout: K responses to each prompt from the rollout backend (:meth:`generate`);
    2. reward: one per response from the domain's reward function (:meth:`score`);
    3. advantage: old-policy logprobs (one no-grad pass; they give the importance
       ratio's denominator AND the group entropy, so GEPO costs no extra pass), then
       the configured processor (an estimator such as GRPO, or a shaper such as GEPO
       around one; its state belongs to the loop) (:meth:`advantages`);
    4. update: ``ppo_epochs`` passes of minibatches, one optimizer step each
       (:func:`~gepo_xtuner.engine.step.update.ppo_update`);
    5. sync: the rollout backend takes the new weights.

    A stage hands the next only its outputs (:class:`~.batching.Rollouts`, rewards,
    advantages), so rollouts can be produced ahead of the update they feed.

    Run state: the loop owns everything that changes during training (:meth:`state_dict`
    / :meth:`load_state_dict`), checkpointed under ``'gepo_xtuner/rl_loop'`` by the
    :class:`~gepo_xtuner.engine.state.loop_state_hook.RLLoopStateHook` it registers.

    Metrics of the step go to the runner as the iteration's outputs (logged by
    mmengine's LoggerHook and visualizer backends as ``train/<name>``).

    Args:
        runner: the mmengine runner.
        dataloader: prompt dataloader config; its ``batch_size`` is B per rank and
            its ``collate_fn`` must keep records as a list of dicts
            (``list_collate``).
        **train_cfg: the config's ``train_cfg`` keys, each one field of
            :class:`~gepo_xtuner.engine.train_cfg.TrainCfg` (or of its parts), with its
            default and help there; built and checked first thing, by the same call
            ``tools/check_config.py`` makes. The optimizer wrapper must not set
            ``accumulative_counts``: the loop accumulates.
    """

    def __init__(self, runner, dataloader: Any, **train_cfg: Any) -> None:
        cfg = TrainCfg.from_dict(train_cfg)  # refused before anything is built
        super().__init__(runner, dataloader)
        # completed with the tokenizer's EOS in run()
        self.cfg = cfg
        self.update_settings = cfg.update
        check_accumulation(runner.optim_wrapper)
        self._max_iters = cfg.max_steps
        self._max_epochs = 1
        self._epoch = 0
        self._iter = 0
        self.advantage = ADVANTAGES.build(cfg.advantage)
        check_group_size(self.advantage, cfg.num_responses)
        prompts = getattr(self.dataloader, 'batch_size', None)  # None: sizes vary
        warn_step_geometry(prompts, cfg.num_responses, cfg.update.minibatch_responses_per_rank,
                           cfg.update.ppo_epochs, dist_world_size(), cfg.prompts_per_step,
                           cfg.minibatch_responses)
        self.no_signal = NoSignalWatch()  # warns after steps without gradient signal
        self.step_metrics: dict[str, float] = {}  # what the current step logged
        self.stop_training = False  # a hook may end the run early (mmengine's convention)
        self.advantage_state: Any = self.advantage.init_state()  # None when stateless
        self.rollout = ROLLOUT_BACKENDS.build(cfg.rollout)
        lp_temperature = cfg.check_backend(self.rollout)
        self.rewards = RewardRouter(cfg.rewards, route_by=cfg.reward_route_by)
        # the rollout's logprobs under the trainer's distribution? (else no logprob gap metric)
        self._rollout_comparable = lp_temperature == cfg.sampling.temperature
        self.sampling: SamplingParams | None = None
        self._placeholders: tuple[int, ...] = ()  # the policy's image placeholder tokens
        self.validator = Validator(cfg.val) if cfg.val else None
        for where, records in self._record_sets().items():  # scorable? fail now, not at step 1
            self.rewards.check_records(records, where)
        self.history: list[dict[str, float]] = []  # per-step metrics, checkpointed
        # what a checkpoint's steps mean; compared on --resume
        self.settings = run_settings(cfg, prompts_per_rank=prompts, world_size=dist_world_size())
        self._rank_states: list[dict[str, Any]] | None = None  # every rank's, after a step
        self._resume: dict[str, Any] | None = None  # this rank's saved entry, on --resume
        self._prime_buckets = False  # see optim_step.prime_gradient_buckets
        self.dataloader_iterator = _InfiniteDataloaderIterator(self.dataloader)
        # in turn, one batch ahead or streaming; the seed is read when used (--resume may
        # replace it)
        self.rollout_stage = build_rollout_stage(cfg.stage, self.rollout,
                                                 self.dataloader_iterator, self.encode_requests,
                                                 lambda: self.runner.seed, cfg.max_steps)
        if not any(isinstance(h, RLLoopStateHook) for h in runner.hooks):
            runner.register_hook(RLLoopStateHook(), priority='VERY_LOW')

    @classmethod
    def check_keys(cls, keys: Iterable[str]) -> None:
        """Refuses ``train_cfg`` keys the loop does not take, saying what was meant
        (:meth:`~gepo_xtuner.engine.train_cfg.TrainCfg.check_keys`)."""
        TrainCfg.check_keys(keys)

    @classmethod
    def train_cfg_keys(cls) -> list[str]:
        """Every ``train_cfg`` key the loop takes (:meth:`TrainCfg.keys`)."""
        return TrainCfg.keys()

    # what mmengine's runner and hooks read of a loop
    max_epochs = property(lambda self: self._max_epochs)
    max_iters = property(lambda self: self._max_iters)
    epoch = property(lambda self: self._epoch)
    iter = property(lambda self: self._iter)

    @property
    def policy(self):
        model = self.runner.model
        return model.module if is_model_wrapper(model) else model

    def run(self) -> torch.nn.Module:
        """Runs the remaining RL steps (after ``--resume``, from the saved step).

        Raises:
            RuntimeError: resumed at or beyond ``max_steps``: nothing is left to train
                (before any hook runs, so no output is written).
        """
        if self._iter >= self._max_iters:
            raise RuntimeError(
                f'nothing left to train: the checkpoint is at step {self._iter} and '
                f'train_cfg.max_steps is {self._max_iters}; nothing was run and no output was '
                'written. To train further, resume with a larger max_steps, e.g. '
                f'--cfg-options train_cfg.max_steps={self._iter + 1}')
        self.runner.call_hook('before_train')
        policy = self.policy
        tokenizer = policy.tokenizer
        for warning in check_policy_inputs(self._record_sets(), tokenizer,  # chat, images
                                           getattr(policy, 'processor', None)):
            print_log(warning, logger='current', level=logging.WARNING)
        self.rollout.attach(policy.llm, tokenizer)
        self.rollout_stage.start()
        self._placeholders = placeholder_token_ids(getattr(policy.llm, 'config', None))
        self.sampling = self.cfg.sampling_for(tokenizer.eos_token_id)
        if policy.policy_loss.agg == 'seq-mean-token-sum-norm':
            print_log(f'the policy loss divides by the constant length '
                      f'{self.update_settings.norm_length} (train_cfg.norm_length; default '
                      'sampling.max_new_tokens)', logger='current')
        check_accumulation(self.runner.optim_wrapper)  # now built (and after --deepspeed)
        print_log(f'advantage: {self.advantage!r}; policy loss: {policy.policy_loss!r}',
                  logger='current')
        note = self.advantage.start_note(self.advantage_state)
        if note:
            print_log(note, logger='current')
        for _ in range(self._iter):  # resume: skip the prompts already used
            next(self.dataloader_iterator)
        if self._iter:  # resumed: servers still hold the weights they started with
            self.rollout.update_weights(policy.llm)
            self._prime_buckets = True  # DDP: the bucket layout of the uninterrupted run
        if self._resume is not None:  # ... then continue this rank's saved random streams
            resume_streams(self._resume['entry'], self.runner.seed, self._iter)
            self._resume = None
        metrics = self._validate(0) if self._iter == 0 else None  # the starting point
        if metrics is not None:
            self.runner.visualizer.add_scalars(metrics, step=0)
            self.history.append(dict(step=0.0, **metrics))
        # one "epoch" spans the run, as in mmengine's iteration-based loop
        self.runner.call_hook('before_train_epoch')
        try:
            while self._iter < self._max_iters and not self.stop_training:
                self.run_iter(self.rollout_stage.next_records())
        except BaseException:
            self.rollout_stage.discard()  # no generation left running behind the error
            raise
        self.rollout_stage.finish()  # e.g. a streaming producer, before the backend closes
        self.runner.call_hook('after_train_epoch')
        self.runner.call_hook('after_train')
        self.rollout.close()  # e.g. stops an LMDeploy server the backend launched
        return self.runner.model

    def _record_sets(self) -> dict[str, list[dict]]:
        """The records the run reads, by where they are configured (checked at start)."""
        records = getattr(getattr(self.dataloader, 'dataset', None), 'records', None)
        sets = {'train_dataloader.dataset': records} if isinstance(records, list) else {}
        for vs in (self.validator.sets if self.validator else ()):
            sets[f'train_cfg.val {vs.name or "path"}'] = vs.records
        return sets

    def encode_requests(self, records: list[dict]) -> list[RolloutRequest]:
        """Rollout requests for ``records``: token ids, and for records with images the
        images and the processor's inputs
        (:func:`~gepo_xtuner.engine.step.prompt_encoding.encode_request`).
        """
        policy = self.policy
        processor = getattr(policy, 'processor', None)
        return [encode_request(r, policy.tokenizer, processor, self.cfg.prompt_template)
                for r in records]

    # -- run state -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything of the run that changes during training, as of the end of this step:
        ``ranks`` (each rank's ``rng``, ``policy_loss`` and ``rollout`` state, gathered at
        the end of the step), ``history`` (per-step metrics), ``advantage`` (stateful
        processors only) and ``settings``; the keys are described in
        :mod:`~gepo_xtuner.engine.state.run_state` and ``docs/architecture.md``.
        """
        ranks = self._rank_states if self._rank_states is not None else [self._rank_state()]
        self.rollout_stage.complete(ranks)
        state: dict[str, Any] = dict(ranks=ranks, history=list(self.history),
                                     settings=dict(self.settings))
        if self.advantage_state is not None:
            state['advantage'] = dict(processor=type(self.advantage).__name__,
                                      state=self.advantage_state.state_dict())
        return state

    def _rank_state(self) -> dict[str, Any]:
        """This rank's part of the run state (see :meth:`state_dict`), without the batch
        generated ahead (:meth:`prepare_checkpoint` adds it)."""
        return dict(rng=capture_rng(), policy_loss=self.policy.policy_loss.state_dict(),
                    rollout=self.rollout.state_dict())

    def prepare_checkpoint(self) -> None:
        """Gathers every rank's share of the rollout stage (the batch generated ahead, as
        samples) into the run state, for a checkpoint saved at the end of this step.

        The stage does it at the steps the ``CheckpointHook`` saves at; a hook that saves
        off that schedule calls it on every rank first (a collective), as the run-health
        hook's ``action='stop'`` does. Without it, the other ranks than the saving one
        generate their batch again on resume (with a warning).
        """
        if self._rank_states is not None:
            self.rollout_stage.gather(self._rank_states)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from :meth:`state_dict`'s output.

        Rank ``r`` takes its entry (:func:`~gepo_xtuner.engine.state.run_state.saved_rank_entry`;
        its random streams at the start of :meth:`run`). Settings that differ from the
        checkpoint's are listed with what the change means. A missing entry, or processor
        state of another processor class, leaves that part fresh and says so in the log.
        """
        self.history = list(state.get('history', []))
        entry, warning = saved_rank_entry(state)
        self._resume = dict(entry=entry)
        if entry is not None and 'policy_loss' in entry:
            self.policy.policy_loss.load_state_dict(entry['policy_loss'])
        if entry is not None and 'rollout' in entry:
            self.rollout.load_state_dict(entry['rollout'])
        self.rollout_stage.restore(state, entry)
        for line in ([warning] if warning else []) + [
                f'resumed with changed settings: {change}'
                for change in describe_changes(state.get('settings', {}), self.settings)]:
            print_log(line, logger='current', level=logging.WARNING)
        restore_processor_state(self.advantage, self.advantage_state, state.get('advantage'))

    def _validate(self, step: int) -> dict[str, float] | None:
        """Validation metrics at ``step`` (0: before training), logged; None when not due
        (every ``interval`` steps and after the last). On a random stream of its own:
        training's is untouched."""
        if self.validator is None or not (step % self.validator.interval == 0
                                          or step == self._max_iters):
            return None
        with isolated_rng(self.runner.seed, step):
            metrics = self.validator.run(self.rollout, self.rewards, self.policy.tokenizer,
                                         self.encode_requests, self.sampling)
        shown = '  '.join(f'{k}={v:.3f}' for k, v in sorted(metrics.items()))
        self.runner.logger.info(f'Validation at step {step}: {shown}')
        return metrics

    def run_iter(self, records: list[dict]) -> None:
        """One RL step on this rank's ``records`` (B prompt records): rollout -> reward ->
        advantage -> update -> sync, each one call, then the step's metrics."""
        self.runner.call_hook('before_train_iter', batch_idx=self._iter, data_batch=records)
        clock = StageClock()
        with clock('rollout'):
            rollouts = self.generate(records)
        with clock('reward'):
            rewards, metrics = self.score(rollouts)
        with clock('advantage'):
            old_logprobs, adv = self.advantages(rollouts, rewards, metrics)
        with clock('update'):
            metrics.update(ppo_update(self.runner.model, self.runner.optim_wrapper,
                                      rollouts.batch, old_logprobs, adv.advantages, adv.keep,
                                      self.update_settings, prime_buckets=self._prime_buckets))
            self._prime_buckets = False
        self.rollout_stage.before_sync(clock)  # no request in flight during the push
        with clock('sync'):
            self.rollout.update_weights(self.policy.llm)
        self.end_step(rollouts, metrics, clock.seconds)

    def generate(self, records: list[dict]) -> Rollouts:
        """K responses to each record from the rollout stage (generated now, or ahead:
        :mod:`~gepo_xtuner.engine.step.rollout_stage`), as padded tensors."""
        requests = self.encode_requests(records)
        samples, version, seconds = self.rollout_stage.responses(
            self._iter, records, requests, self.sampling, self._iter + 1 == self._max_iters)
        if self._placeholders:  # a VLM cannot score responses holding image slots
            samples = cut_at_tokens(samples, self._placeholders)
        mm = [r.mm_inputs or {} for r in requests]  # per prompt; rows gather their own
        batch = build_response_batch([r.prompt_ids for r in requests], samples,
                                     self.policy.tokenizer.pad_token_id, mm if any(mm) else None)
        return Rollouts(records, samples, batch, version=version, seconds=seconds)

    def score(self, rollouts: Rollouts) -> tuple[torch.Tensor, dict[str, float]]:
        """One reward per response ``(N,)``, and the reward metrics of the step."""
        texts = self.policy.tokenizer.batch_decode(
            [s.response_ids for group in rollouts.samples for s in group],
            skip_special_tokens=True)
        return self.rewards(texts, rollouts.row_records)

    def advantages(self, rollouts: Rollouts, rewards: torch.Tensor, metrics: dict[str, float]
                   ) -> tuple[torch.Tensor, Any]:
        """Old-policy logprobs ``(N, R)`` (one no-grad pass, which also gives the group
        entropies) and the advantage processor's output; adds their metrics to ``metrics``."""
        batch, rows = rollouts.batch, rollouts.row_records
        old_logprobs, entropy = old_logprobs_of(self.policy, batch, self.update_settings)
        domain_ids, names = encode_domains([r['domain'] for r in rows])
        group_logprobs = (old_logprobs if self.cfg.entropy_logprobs == 'proximal'
                          else batch.rollout_logprobs)
        adv = self.advantage(
            AdvantageInputs(rewards=rewards, group_ids=batch.group_index, logprobs=group_logprobs,
                         mask=batch.response_mask, entropies=entropy, domain_ids=domain_ids,
                         domain_names=names, prompt_ids=[r['id'] for r in rows]),
            self.advantage_state)
        metrics.update(adv.metrics)
        if adv.band is not None:  # any shaper's band, under one name: console and figure
            metrics.update({BAND_KEYS[0]: adv.band.low, BAND_KEYS[1]: adv.band.high})
        self.no_signal.observe(adv.advantages, metrics)
        metrics.update(entropy_metrics(batch, old_logprobs, entropy, domain_ids, names,
                                       self._rollout_comparable))
        return old_logprobs, adv

    def end_step(self, rollouts: Rollouts, metrics: dict[str, float],
                 times: dict[str, float]) -> None:
        """Validation (every ``interval`` steps), throughput and time metrics, the history,
        every rank's run state, then the runner's ``after_train_iter`` hooks."""
        metrics.update(self.rollout.pop_metrics())
        step = self._iter + 1
        t = time.perf_counter()
        val = self._validate(step)
        if val is not None:
            times['validation'] = time.perf_counter() - t
            metrics.update(val)
        metrics.update(self.rollout_stage.step_metrics(self._iter, rollouts, times['rollout']))
        metrics.update({f'time/{k}': v for k, v in times.items()})
        metrics['time/step'] = sum(v for k, v in times.items() if k != 'validation')
        # undefined values (the band before it exists, the skewness of all-zero advantages)
        # are left out: NaN is not JSON, and a reader treats an absent key as "not measured"
        metrics = {k: v for k, v in metrics.items() if math.isfinite(v)}
        self.history.append(dict(step=float(step), **metrics))
        self.step_metrics = metrics
        # every rank's streams as of the end of this step, for a checkpoint saved now
        self._rank_states = gather_rank_states(self._rank_state())
        self.rollout_stage.end_step(self.runner, self._max_iters, self._rank_states)
        self.runner.call_hook('after_train_iter', batch_idx=self._iter,
                              data_batch=rollouts.records, outputs=metrics)
        self._iter += 1

