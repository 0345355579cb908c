"""The RL step as an mmengine train loop: rollout -> reward -> advantage -> updates -> sync."""

import difflib
import inspect
import logging
import math
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import LOOPS
from mmengine.runner.base_loop import BaseLoop
from mmengine.runner.loops import _InfiniteDataloaderIterator

from ..advantage import RolloutBatch, encode_domains
from ..ops.distributed import all_reduce, dist_rank, dist_world_size
from ..ops.multimodal import mm_to, placeholder_token_ids
from ..registry import ADVANTAGES, ROLLOUT_BACKENDS
from ..reward import RewardRouter
from ..rollout import RolloutRequest, SamplingParams
from .geometry import StepGeometry, check_group_size
from .batching import (KEPT_ROWS, ResponseBatch, build_response_batch, cut_at_tokens,
                       kept_minibatches, loss_inputs, micro_batches, minibatches)
from .loop_state_hook import RLLoopStateHook
from .optim_step import (check_accumulation, optimizer_step, prime_gradient_buckets,
                         reduces_every_backward)
from .requests import check_policy_inputs, encode_request
from .run_state import (capture_rng, describe_changes, gather_rank_states, rank_entry,
                        restore_rng, run_settings, seed_streams)
from .validation import Validator

#: ``train_cfg`` keys of earlier versions -> the key that replaced them (refused with
#: the new name, see :meth:`RLTrainLoop.check_keys`).
RENAMED_KEYS = {'minibatch_size': 'minibatch_responses_per_rank'}


@LOOPS.register_module()
class RLTrainLoop(BaseLoop):
    """Online RL with group-relative advantages (GRPO, GEPO, ...) for ``xtuner train``.

    One loop iteration is one RL step:

    1. take B prompts (this rank's batch from ``train_dataloader``);
    2. sample K responses each from the rollout backend;
    3. score them with the domain's reward function;
    4. compute old-policy logprobs (one no-grad forward; they give the importance
       ratio's denominator AND the group entropy, so GEPO costs no extra pass);
    5. advantages from the configured processor (an estimator such as GRPO, or a
       shaper such as GEPO around one; a shaper's state, e.g. GEPO's thresholds,
       belongs to the loop);
    6. ``ppo_epochs`` passes over the B*K responses in shuffled minibatches of
       ``minibatch_responses_per_rank`` responses: one optimizer step each
       (:func:`optimizer_step`), with the gradients of the minibatch's micro-batches
       accumulated explicitly;
    7. hand the new weights to the rollout backend.

    Run state: the loop is the one owner of everything that changes during
    training (the processor's state, the RNG states, the metric history, the
    policy loss's generators, the rollout backend's counters), exposed as
    :meth:`state_dict` / :meth:`load_state_dict`. It registers
    :class:`~gepo_xtuner.engine.loop_state_hook.RLLoopStateHook`, which stores that
    dict in every checkpoint under ``'gepo_xtuner/rl_loop'`` and hands it back on
    ``--resume``; configs list no hook for it.

    Loss normalisation: every micro-batch's loss is divided by the minibatch's
    token (or response) count over ALL ranks (one all-reduce per minibatch) and
    multiplied by the world size before backward (data-parallel wrappers average
    gradients), so M micro-batches on P ranks give the gradient of one big batch,
    whatever the split and however unequal the ranks' token counts.

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
            ``stop_token_ids`` defaults to the tokenizer's EOS. The trainer scores
            responses under ``softmax(logits / temperature)``; ``top_p`` < 1 and
            ``top_k`` > 0 truncate the sampled distribution and are refused, as is
            greedy decoding (temperature 0).
        prompt_template: ``str.format`` template applied to each record's ``prompt``
            (records with chat ``messages`` use the tokenizer's chat template instead).
            Records with ``images`` go through the policy's processor, see
            :mod:`gepo_xtuner.engine.requests` and ``docs/multimodal.md``.
        minibatch_responses_per_rank: responses per optimizer step on one rank (the
            paper's minibatch of 32 prompts x K=16 is 512 responses over all ranks).
            Optimizer steps per pass: ``ceil(B*K / minibatch_responses_per_rank)``, or fewer
            on steps where the advantage processor removed rows (``kept_rows``).
        kept_rows: how the rows are trained when the advantage processor removed some
            (AEPO while its gate is on): ``'full_minibatches'`` (default, as AEPO's
            authors ran it on verl: the kept rows in minibatches of
            ``minibatch_responses_per_rank``, so fewer optimizer steps of full size, see
            :func:`kept_minibatches`) or
            ``'spread'`` (the step count of the full batch, kept rows spread over it:
            more, smaller optimizer steps).
        max_tokens_per_micro_batch: token budget of one forward/backward: a
            minibatch is split into the fewest micro-batches whose padded block
            (``rows x (longest prompt + longest response)``) fits, balanced
            (:func:`~gepo_xtuner.engine.batching.micro_batches`); when the policy
            packs sequences (``model.packing``, text-only steps) the budget counts
            real tokens instead, ``sum (prompt + response)``; None: one
            micro-batch per minibatch. The optimizer wrapper must not set
            ``accumulative_counts``: the loop accumulates.
        logprob_max_tokens_per_micro_batch: the same budget for the no-grad
            old-logprob pass; defaults to ``max_tokens_per_micro_batch``.
        ppo_epochs: passes over each rollout batch.
        val: optional :class:`~gepo_xtuner.engine.validation.Validator` arguments:
            ``dict(path=..., interval=...)`` (one held-out file, logged per domain as
            ``val/<domain>/acc``) and/or ``benchmarks=[dict(name=..., path=..., n=...,
            temperature=...), ...]`` (logged as ``val/<name>/acc``), validated before
            the first step, every ``interval`` steps and after the last, with the
            step's metrics (so checkpoints carry it too).
        reward_route_by: the record field that picks the reward function,
            ``'domain'`` (default) or ``'data_source'``.
        prompts_per_step, minibatch_responses: the intended prompts per RL step and
            responses per optimizer step over ALL ranks; when set, a world size that
            does not split them evenly is refused (:class:`StepGeometry`).
        **unknown: keys the loop does not take: refused by :meth:`check_keys`, with
            the key that replaced a renamed one, or the closest accepted key.
    """

    def __init__(self, runner, dataloader: Any, max_steps: int, rollout: dict, advantage: dict,
                 rewards: dict, num_responses: int = 8, sampling: dict | None = None,
                 prompt_template: str = '{prompt}', minibatch_responses_per_rank: int = 32,
                 max_tokens_per_micro_batch: int | None = None,
                 logprob_max_tokens_per_micro_batch: int | None = None, ppo_epochs: int = 1,
                 val: dict | None = None, reward_route_by: str = 'domain',
                 prompts_per_step: int | None = None, minibatch_responses: int | None = None,
                 kept_rows: str = 'full_minibatches', **unknown: Any) -> None:
        self.check_keys(unknown)
        super().__init__(runner, dataloader)
        if min(max_steps, num_responses, minibatch_responses_per_rank, ppo_epochs) < 1:
            raise ValueError('RLTrainLoop needs max_steps, num_responses, '
                             f'minibatch_responses_per_rank and ppo_epochs >= 1, got {max_steps}, '
                             f'{num_responses}, {minibatch_responses_per_rank}, {ppo_epochs}')
        for name, value in (('max_tokens_per_micro_batch', max_tokens_per_micro_batch),
                            ('logprob_max_tokens_per_micro_batch',
                             logprob_max_tokens_per_micro_batch)):
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise ValueError(f'train_cfg.{name} must be an int >= 1 or None, got {value!r}')
        if kept_rows not in KEPT_ROWS:
            raise ValueError(f'train_cfg.kept_rows must be one of {list(KEPT_ROWS)}, got '
                             f'{kept_rows!r}')
        check_accumulation(runner.optim_wrapper)
        self.kept_rows = kept_rows
        self._max_iters = max_steps
        self._max_epochs = 1
        self._epoch = 0
        self._iter = 0
        self.minibatch_responses_per_rank = minibatch_responses_per_rank
        self.max_tokens = max_tokens_per_micro_batch
        self.logprob_max_tokens = logprob_max_tokens_per_micro_batch or max_tokens_per_micro_batch
        self.ppo_epochs = ppo_epochs
        self.prompt_template = prompt_template
        self.advantage = ADVANTAGES.build(advantage)
        check_group_size(self.advantage, num_responses)
        prompts = getattr(self.dataloader, 'batch_size', None)
        if isinstance(prompts, int):  # None with a custom batch sampler: sizes vary
            geometry = StepGeometry(prompts, num_responses, minibatch_responses_per_rank,
                                    ppo_epochs, dist_world_size(), prompts_per_step,
                                    minibatch_responses)
            for warning in geometry.warnings():
                print_log(warning, logger='current', level=logging.WARNING)
        self.no_signal_warn_steps = 3  # consecutive steps without gradient signal -> warning
        self._no_signal_steps = 0
        self.step_metrics: dict[str, float] = {}  # what the current step logged
        self.stop_training = False  # a hook may end the run early (mmengine's convention)
        self.advantage_state: Any = self.advantage.init_state()  # None when stateless
        self.rollout = ROLLOUT_BACKENDS.build(rollout)
        self.rewards = RewardRouter(rewards, route_by=reward_route_by)
        self._sampling_cfg = dict(sampling or {}, n=num_responses)
        check_training_sampling(SamplingParams(**{**self._sampling_cfg, 'stop_token_ids': ()}))
        self.sampling: SamplingParams | None = None
        self._placeholders: tuple[int, ...] = ()  # the policy's image placeholder tokens
        self.validator = Validator(**val) if val else None
        # every record must be scorable by its reward: a bad file fails now, not at step 1
        records = getattr(getattr(self.dataloader, 'dataset', None), 'records', None)
        if isinstance(records, list):
            self.rewards.check_records(records, 'train_dataloader.dataset')
        for vs in (self.validator.sets if self.validator else ()):
            self.rewards.check_records(vs.records, f'train_cfg.val {vs.name or "path"}')
        self.history: list[dict[str, float]] = []  # per-step metrics, checkpointed
        # what a checkpoint's steps mean; compared on --resume
        self.settings = run_settings(num_responses=num_responses, prompts_per_rank=prompts,
                                     minibatch_responses_per_rank=minibatch_responses_per_rank,
                                     ppo_epochs=ppo_epochs, world_size=dist_world_size(),
                                     max_steps=max_steps, advantage=advantage,
                                     kept_rows=kept_rows)
        self._rank_states: list[dict[str, Any]] | None = None  # every rank's, after a step
        self._resume: dict[str, Any] | None = None  # this rank's saved entry, on --resume
        self._prime_buckets = False  # see optim_step.prime_gradient_buckets
        self.dataloader_iterator = _InfiniteDataloaderIterator(self.dataloader)
        if not any(isinstance(h, RLLoopStateHook) for h in runner.hooks):
            runner.register_hook(RLLoopStateHook(), priority='VERY_LOW')

    @classmethod
    def check_keys(cls, keys: Iterable[str]) -> None:
        """Refuses ``train_cfg`` keys the loop does not take, saying what was meant.

        Raises:
            TypeError: for each unknown key, the key that replaced it
                (:data:`RENAMED_KEYS`) or the closest key the loop takes.
        """
        params = inspect.signature(cls.__init__).parameters
        accepted = [name for name, p in params.items() if p.kind is not p.VAR_KEYWORD
                    and name not in ('self', 'runner', 'dataloader')]
        unknown = [key for key in keys if key not in accepted and key != 'type']
        if not unknown:
            return
        hints = []
        for key in unknown:
            if key in RENAMED_KEYS:
                hints.append(f'train_cfg.{key} was renamed: use train_cfg.{RENAMED_KEYS[key]}')
            elif close := difflib.get_close_matches(key, accepted, n=1):
                hints.append(f'did you mean train_cfg.{close[0]}?')
        names = ', '.join(repr(key) for key in unknown)
        plural = 's' if len(unknown) > 1 else ''
        raise TypeError(f'got an unexpected keyword argument{plural} {names}'
                        + (f' ({"; ".join(hints)})' if hints else ''))

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
        self._check_policy_inputs(policy)
        self.rollout.attach(policy.llm, tokenizer)
        self._placeholders = placeholder_token_ids(getattr(policy.llm, 'config', None))
        cfg = dict(self._sampling_cfg)
        cfg.setdefault('stop_token_ids', (tokenizer.eos_token_id, ))
        self.sampling = SamplingParams(**{**cfg, 'stop_token_ids': tuple(cfg['stop_token_ids'])})
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
            self._restore_rank_state(self._resume)
            self._resume = None
        if self.validator is not None and self._iter == 0:  # the starting point
            with isolated_rng(self.runner.seed, 0):
                metrics = self._validate()
            self.runner.visualizer.add_scalars(metrics, step=0)
            self.history.append(dict(step=0.0, **metrics))
            self._log_validation(0, metrics)
        # one "epoch" spans the run, as in mmengine's iteration-based loop
        self.runner.call_hook('before_train_epoch')
        while self._iter < self._max_iters and not self.stop_training:
            self.run_iter(next(self.dataloader_iterator))
        self.runner.call_hook('after_train_epoch')
        self.runner.call_hook('after_train')
        self.rollout.close()  # e.g. stops an LMDeploy server the backend launched
        return self.runner.model

    def _check_policy_inputs(self, policy) -> None:
        """Chat records, images: readable by this policy? (before the first step)"""
        sets = {'train_dataloader.dataset':
                getattr(getattr(self.dataloader, 'dataset', None), 'records', None) or []}
        for vs in (self.validator.sets if self.validator else ()):
            sets[f'train_cfg.val {vs.name or "path"}'] = vs.records
        for warning in check_policy_inputs(sets, policy.tokenizer,
                                           getattr(policy, 'processor', None)):
            print_log(warning, logger='current', level=logging.WARNING)

    def encode_requests(self, records: list[dict]) -> list[RolloutRequest]:
        """Rollout requests for ``records``: token ids, and for records with images the
        images and the processor's inputs (:func:`~gepo_xtuner.engine.requests.encode_request`).
        """
        policy = self.policy
        processor = getattr(policy, 'processor', None)
        return [encode_request(r, policy.tokenizer, processor, self.prompt_template)
                for r in records]

    # -- run state -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything of the run that changes during training, as of the end of this step.

        Returns:
            ``ranks`` (one entry per data-parallel rank, in rank order, gathered at the
            end of the step: ``rng``, the torch/CUDA, NumPy and Python states that
            sampling, minibatch shuffles and Clip-Cov's unseeded token choice draw
            from; ``policy_loss``, e.g. Clip-Cov's seeded generators; ``rollout``, the
            backend's counters), ``history`` (per-step metrics, for the
            training-curve figure), ``advantage`` (``dict(processor=<class name>,
            state=...)``, stateful processors only; the same on every rank) and
            ``settings`` (:func:`~gepo_xtuner.engine.run_state.run_settings`, compared
            on resume). The data position needs no entry: on resume the loop skips
            the prompts of the completed steps, which mmengine's samplers replay
            deterministically.
        """
        ranks = self._rank_states if self._rank_states is not None else [self._rank_state()]
        state: dict[str, Any] = dict(ranks=ranks, history=list(self.history),
                                     settings=dict(self.settings))
        if self.advantage_state is not None:
            state['advantage'] = dict(processor=type(self.advantage).__name__,
                                      state=self.advantage_state.state_dict())
        return state

    def _rank_state(self) -> dict[str, Any]:
        """This rank's part of the run state (see :meth:`state_dict`)."""
        return dict(rng=capture_rng(), policy_loss=self.policy.policy_loss.state_dict(),
                    rollout=self.rollout.state_dict())

    def _restore_rank_state(self, resume: dict[str, Any]) -> None:
        """Sets this rank's saved random streams (at the start of :meth:`run`, once the
        used prompts are skipped), or seeds streams of its own when it has none."""
        entry = resume['entry']
        if entry is None:
            seed_streams(self.runner.seed, dist_rank(), self._iter)
        elif entry.get('rng') is not None:
            restore_rng(entry['rng'])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from :meth:`state_dict`'s output.

        Rank ``r`` takes entry ``r`` of ``ranks`` (applied at the start of
        :meth:`run`); a checkpoint of another world size is explained in the log
        (:func:`~gepo_xtuner.engine.run_state.rank_entry`). Settings that differ from
        the checkpoint's are listed with what the change means. Checkpoints of earlier
        versions hold one ``rng`` entry (rank 0's): every rank restores it, with a
        warning when there are several ranks. A missing entry, or processor state of
        another processor class, leaves that part fresh and says so in the log.
        """
        self.history = list(state.get('history', []))
        if 'ranks' in state:
            entry, warning = rank_entry(state['ranks'])
        else:  # earlier versions: rank 0's streams only
            entry = {k: state[k] for k in ('rng', 'policy_loss', 'rollout') if k in state}
            warning = None if dist_world_size() == 1 else (
                'the checkpoint holds the random state of rank 0 only (written by an earlier '
                'version): every rank continues from it, so the run will not repeat an '
                'uninterrupted one exactly')
        self._resume = dict(entry=entry)
        if entry is not None and 'policy_loss' in entry:
            self.policy.policy_loss.load_state_dict(entry['policy_loss'])
        if entry is not None and 'rollout' in entry:
            self.rollout.load_state_dict(entry['rollout'])
        for line in ([warning] if warning else []) + [
                f'resumed with changed settings: {change}'
                for change in describe_changes(state.get('settings', {}), self.settings)]:
            print_log(line, logger='current', level=logging.WARNING)
        if self.advantage_state is None:
            return
        current = type(self.advantage).__name__
        saved = state.get('advantage')
        if saved is None:
            print_log(f'checkpoint has no advantage state for {current}; its state (e.g. '
                      "GEPO's entropy band) starts fresh", logger='current', level=logging.WARNING)
        elif saved['processor'] != current:
            print_log(f'checkpoint holds {saved["processor"]} state but this run uses '
                      f'{current}; the advantage state starts fresh', logger='current',
                      level=logging.WARNING)
        else:
            self.advantage_state.load_state_dict(saved['state'])
            print_log(f'restored {current} state: {saved["state"]}', logger='current')

    def _validate(self) -> dict[str, float]:
        return self.validator.run(self.rollout, self.rewards, self.policy.tokenizer,
                                  self.encode_requests, self.sampling)

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
                         mask=batch.response_mask, entropies=entropy, domain_ids=domain_ids,
                         domain_names=names, prompt_ids=[r['id'] for r in flat_records]),
            self.advantage_state)
        metrics.update(adv.metrics)
        self._check_signal(adv.advantages, metrics)
        metrics.update(self._entropy_metrics(batch, old_logprobs, entropy, domain_ids, names))
        times['advantage'] = time.perf_counter() - t

        t = time.perf_counter()
        metrics.update(self._update(batch, old_logprobs, adv.advantages, adv.keep))
        times['update'] = time.perf_counter() - t

        t = time.perf_counter()
        self.rollout.update_weights(self.policy.llm)
        times['sync'] = time.perf_counter() - t
        metrics.update(self.rollout.pop_metrics())

        step = self._iter + 1
        if self.validator is not None and (step % self.validator.interval == 0
                                           or step == self._max_iters):
            t = time.perf_counter()
            with isolated_rng(self.runner.seed, step):  # training's RNG stream is untouched
                val = self._validate()
            times['validation'] = time.perf_counter() - t
            metrics.update(val)
            self._log_validation(step, val)

        new_tokens = int(batch.response_mask.sum())
        metrics['perf/gen_tokens'] = float(new_tokens)
        metrics['perf/gen_tokens_per_sec'] = new_tokens / max(times['rollout'], 1e-9)
        metrics.update({f'time/{k}': v for k, v in times.items()})
        metrics['time/step'] = sum(v for k, v in times.items() if k != 'validation')
        # undefined values (the band before it exists, the skewness of all-zero advantages)
        # are left out: NaN is not JSON, and a reader treats an absent key as "not measured"
        metrics = {k: v for k, v in metrics.items() if math.isfinite(v)}
        self.history.append(dict(step=float(step), **metrics))
        self.step_metrics = metrics
        # every rank's streams as of the end of this step, for a checkpoint saved now
        self._rank_states = gather_rank_states(self._rank_state())
        self.runner.call_hook('after_train_iter', batch_idx=self._iter, data_batch=records,
                              outputs=metrics)
        self._iter += 1

    @torch.no_grad()
    def _old_logprobs(self, batch: ResponseBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Old-policy logprobs and full-vocabulary entropies, ``(N, R)`` float32 on CPU.

        One no-grad forward per micro-batch of ``logprob_max_tokens_per_micro_batch``.
        """
        policy = self.policy
        device = next(policy.parameters()).device
        logprobs = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
        entropies = torch.zeros_like(logprobs)
        prompt_len, response_len = batch.lengths()
        packed = getattr(policy, 'packs', False) and batch.mm_inputs is None  # real-token budget
        for rows in micro_batches(torch.arange(len(batch)), prompt_len, response_len,
                                  self.logprob_max_tokens, packed):
            part = batch.rows(rows)
            inputs = {k: getattr(part, k).to(device)
                      for k in ('input_ids', 'attention_mask', 'response_mask')}
            inputs['temperature'] = self.sampling.temperature
            if part.mm_inputs is not None:  # the rows' images: the context rollouts saw
                inputs['mm_inputs'] = mm_to(part.multimodal_inputs(), device)
            lp, ent = policy(inputs=inputs, mode='logprobs')
            width = part.response_width
            logprobs[rows, :width] = lp.float().cpu()
            entropies[rows, :width] = ent.float().cpu()
        return logprobs, entropies

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
                advantages: torch.Tensor, keep: torch.Tensor | None) -> dict[str, float]:
        """``ppo_epochs`` passes of shuffled minibatches, one optimizer step each.

        Rows an advantage processor did not keep (``keep`` False) are in no
        minibatch and no denominator. Every rank takes the same number of steps per
        pass: ``ceil(N / minibatch_responses_per_rank)``, or, when rows were removed on any
        rank and ``kept_rows='full_minibatches'``, that of :func:`kept_minibatches` (fewer
        steps of full size; none when nothing is kept). A rank whose minibatch is empty
        still runs one zero-weighted micro-batch, so that the gradient all-reduce
        of data-parallel training meets on every rank (under DeepSpeed ZeRO, which
        reduces at every backward, as many as the rank with the most).
        """
        world, per_rank = dist_world_size(), self.minibatch_responses_per_rank
        rows = torch.arange(len(batch)) if keep is None else keep.nonzero().flatten()
        prompt_len, response_len = batch.lengths()
        n_total, kept_total = (int(v) for v in all_reduce(
            torch.tensor([float(len(batch)), float(len(rows))], dtype=torch.float64)).tolist())
        if self.kept_rows == 'full_minibatches' and kept_total < n_total:
            def plan() -> list[torch.Tensor]:
                return kept_minibatches(rows, kept_total, per_rank, world)
        else:
            def plan() -> list[torch.Tensor]:
                return minibatches(rows, math.ceil(len(batch) / per_rank))
        if self._prime_buckets:
            self._prime_buckets = False
            empty = loss_inputs(batch, torch.arange(1), old_logprobs, advantages,
                                torch.ones(3, dtype=torch.float64), self.sampling)
            empty['response_mask'] = torch.zeros_like(empty['response_mask'])
            prime_gradient_buckets(self.runner.model, self.runner.optim_wrapper, empty)
        stats = MicroBatchStats()
        lockstep = reduces_every_backward(self.runner.optim_wrapper)
        grad_norms: list[float] = []
        micro_counts: list[int] = []
        minibatch_rows: list[float] = []
        for _ in range(self.ppo_epochs):
            for minibatch in plan():
                mask = batch.response_mask[minibatch]
                totals = all_reduce(torch.tensor([float(mask.sum()), float(mask.any(1).sum()),
                                                  float(len(minibatch))], dtype=torch.float64))
                minibatch_rows.append(float(totals[2]))
                micro = micro_batches(minibatch, prompt_len, response_len, self.max_tokens,
                                      getattr(self.policy, 'packs', False)
                                      and batch.mm_inputs is None)
                micro_counts.append(len(micro))
                inputs = [loss_inputs(batch, m, old_logprobs, advantages, totals, self.sampling)
                          for m in micro]
                # Each rank takes part in every gradient reduction: at least one micro-batch
                # (DDP reduces once, at the last), or, where every backward reduces (DeepSpeed
                # ZeRO), as many as the rank with the most.
                want = max(len(inputs), 1)
                if lockstep:
                    want = int(all_reduce(torch.tensor([want]), op='max'))
                while len(inputs) < want:  # a zero gradient: no valid token, loss 0
                    empty = loss_inputs(batch, torch.arange(1), old_logprobs, advantages, totals,
                                        self.sampling)
                    empty['response_mask'] = torch.zeros_like(empty['response_mask'])
                    inputs.append(empty)
                logs, grad_norm = optimizer_step(self.runner.model, self.runner.optim_wrapper,
                                                 inputs, loss_scale=float(world))
                stats.add_minibatch(logs, [int(i['response_mask'].sum()) for i in inputs])
                if grad_norm is not None:
                    grad_norms.append(grad_norm)
        metrics = stats.reduce()
        metrics['optim/steps'] = float(len(micro_counts))
        metrics['optim/micro_batches'] = sum(micro_counts) / max(len(micro_counts), 1)
        metrics['optim/rows_trained'] = float(len(rows))
        # rows per optimizer step over all ranks (the global minibatch)
        metrics['optim/minibatch_rows'] = sum(minibatch_rows) / max(len(minibatch_rows), 1)
        if grad_norms:
            metrics['optim/grad_norm'] = sum(grad_norms) / len(grad_norms)
        return metrics

    def _check_signal(self, advantages: torch.Tensor, metrics: dict[str, float]) -> None:
        """Warns when no response of the global batch has had a non-zero advantage for
        ``no_signal_warn_steps`` steps in a row: such steps change nothing (``loss/pg``
        0, gradient 0) but cost a full rollout."""
        nonzero = all_reduce(torch.tensor([float((advantages != 0).sum())], dtype=torch.float64))
        self._no_signal_steps = 0 if nonzero.item() > 0 else self._no_signal_steps + 1
        if self._no_signal_steps == self.no_signal_warn_steps:
            print_log(
                f'no learning signal for {self._no_signal_steps} steps: every response had '
                f'advantage 0 (reward/mean {metrics.get("reward/mean", float("nan")):.3f}; '
                'within each group all rewards were equal). Check that the reward function can '
                'score this policy (tools/evaluate.py on a few records), or raise '
                'num_responses, the sampling temperature, or use easier prompts / a warm-started '
                'model', logger='current', level=logging.WARNING)

    def _log_validation(self, step: int, metrics: dict[str, float]) -> None:
        shown = '  '.join(f'{k}={v:.3f}' for k, v in sorted(metrics.items()))
        self.runner.logger.info(f'Validation at step {step}: {shown}')


@contextmanager
def isolated_rng(seed: int | None, step: int) -> Iterator[None]:
    """Runs the block on torch RNG streams of its own, seeded from ``(seed, step)``.

    Validation samples with it, so the training stream (which the checkpoint
    saves) is the same whether or not a validation ran: a run resumed with a
    different ``max_steps`` (whose last step validates) continues exactly.
    """
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(((seed or 0) * 1_000_003 + step) % 2**63)
        yield


def check_training_sampling(params: SamplingParams) -> None:
    """Refuses sampling settings whose distribution the trainer cannot score.

    The trainer's logprobs (importance ratio, GEPO's group entropy) are those of
    ``softmax(logits / temperature)``; nucleus or top-k truncation would make the
    sampled distribution a different one.

    Raises:
        ValueError: naming the setting and the value to use.
    """
    if params.temperature <= 0:
        raise ValueError('train_cfg.sampling.temperature must be > 0 for training (greedy '
                         'decoding has no sampling distribution to score); the paper uses 1.0')
    if params.top_p < 1.0 or params.top_k > 0:
        raise ValueError(
            f'train_cfg.sampling has top_p={params.top_p}, top_k={params.top_k}: the trainer '
            'scores responses under the full softmax(logits / temperature), so a truncated '
            'sampling distribution would bias the importance ratio and the group entropy; set '
            'top_p=1.0 and top_k=0 (validation may still use them, train_cfg.val)')


class MicroBatchStats:
    """Reduces the loss outputs of micro-batches, minibatches and ranks to step metrics.

    - ``loss/pg``, ``loss/kl_ref``, ``loss/cov_tokens``: each micro-batch
      holds its share of a minibatch-normalised sum, so they add up over
      micro-batches and ranks; the step value is their mean over minibatches.
    - ``loss`` (the objective, ``loss/pg`` plus ``kl_coef * loss/kl_ref``) is not
      repeated.
    - ``ratio/max`` / ``ratio/min``: maximum / minimum.
    - everything else (fractions, means): weighted by the micro-batch's tokens.

    Two all-reduces per step (sum, max), whatever the number of micro-batches.
    """

    ADDITIVE = ('loss/pg', 'loss/kl_ref', 'loss/cov_tokens')
    EXTREMES = {'ratio/max': 1.0, 'ratio/min': -1.0}  # sign: reduce all as a max

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.extremes: dict[str, float] = {}
        self.tokens = 0.0
        self.minibatches = 0

    def add_minibatch(self, logs: list[dict[str, torch.Tensor]], tokens: list[int]) -> None:
        self.minibatches += 1
        for log_vars, n in zip(logs, tokens):
            self.tokens += n
            for key, value in log_vars.items():
                if key == 'loss':
                    continue
                value = float(value)
                if key in self.EXTREMES:
                    if n:
                        v = self.EXTREMES[key] * value
                        self.extremes[key] = max(self.extremes.get(key, -math.inf), v)
                    continue
                weight = 1.0 if key in self.ADDITIVE else float(n)
                self.sums[key] = self.sums.get(key, 0.0) + weight * value

    def reduce(self) -> dict[str, float]:
        keys = sorted(self.sums)
        sums = all_reduce(torch.tensor([self.sums[k] for k in keys] + [self.tokens],
                                       dtype=torch.float64)).tolist()
        tokens = sums.pop()
        out = {}
        for key, value in zip(keys, sums):
            name = key if key.startswith(('loss', 'ratio')) else f'loss/{key}'
            out[name] = (value / max(self.minibatches, 1) if key in self.ADDITIVE
                         else value / max(tokens, 1.0))
        ext_keys = sorted(self.EXTREMES)
        ext = all_reduce(torch.tensor([self.extremes.get(k, -math.inf) for k in ext_keys],
                                      dtype=torch.float64), 'max').tolist()
        for key, value in zip(ext_keys, ext):
            if math.isfinite(value):
                out[key] = self.EXTREMES[key] * value
        return out
