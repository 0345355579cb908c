"""``train_cfg``: the RL loop's settings as one typed, frozen object, built once.

:meth:`TrainCfg.from_dict` is the one reader of a config's ``train_cfg``: it refuses
unknown keys (naming the closest one), checks every value, and builds the typed parts
the loop's stages take. :class:`~gepo_xtuner.engine.loop.RLTrainLoop`,
``tools/check_config.py``, the checkpointed run settings
(:func:`~gepo_xtuner.engine.state.run_state.run_settings`) and the rollout-stage builder
all read this object, so a value the run refuses is refused by the check too, with the
same message. The checks that need the built rollout backend are one method,
:meth:`TrainCfg.check_backend`, which both call.

The config stays flat, as users write it (``train_cfg = dict(max_steps=..., ppo_epochs=...,
max_staleness=...)``); each key belongs to one field:

* the fields of :class:`TrainCfg` itself (``sampling`` becomes a
  :class:`~gepo_xtuner.rollout.SamplingParams`, ``val`` a
  :class:`~gepo_xtuner.engine.step.validation.ValSettings`);
* the fields of its parts :class:`~gepo_xtuner.engine.step.update.UpdateSettings`
  (``update``: how the trainer side runs) and :class:`StageSettings` (``stage``: how
  rollouts are produced relative to the update), taken by name.

A new key is one field with a default and an ``Attributes:`` entry in its class's
docstring (the help text :meth:`TrainCfg.help` returns); a derived field (not a key) is
marked ``metadata={'key': False}``.
"""

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..rollout import SamplingParams
from ..settings import check_types, docstring_attributes, refuse_unknown
from .step.update import (UpdateSettings, behaviour_refusal, check_training_sampling,
                          resolve_behaviour_correction)
from .step.validation import ValSettings

__all__ = ['TrainCfg', 'StageSettings', 'RENAMED_KEYS']

#: ``train_cfg`` keys of earlier versions -> the key that replaced them.
RENAMED_KEYS = {'minibatch_size': 'minibatch_responses_per_rank'}

#: metadata of a field that is computed, not read from the config
DERIVED = {'key': False}
#: metadata of a field whose own fields are ``train_cfg`` keys
PART = {'part': True}


@dataclass(frozen=True)
class StageSettings:
    """How rollouts are produced relative to the update
    (:mod:`~gepo_xtuner.engine.step.rollout_stage`).

    Attributes:
        max_staleness: how many weight versions a trained response may be behind, an
            int >= 0. 0 (default): generate, then train, strictly in turn. 1: generate
            the next step's responses on a worker thread while this step is scored and
            trained; each batch is then one weight version old (``rollout/staleness``).
            k >= 2: a producer thread generates groups continuously, at most k batches
            ahead, each group with the weights it started under; a step trains its
            batch's groups once complete, k versions old at most
            (``rollout/staleness[_max]``, ``rollout/buffer_groups``,
            ``rollout/dropped_stale``). Any k >= 1 needs a backend that can overlap (not
            LMDeploy's colocated sleep/wake mode).
        partial_rollout: with k >= 2, whether a weight push interrupts the groups in flight
            instead of waiting for them to finish (default False): each response keeps its
            tokens so far, sampled by the old version, and is continued from them on the
            new weights, so every token keeps the logprob and version that sampled it
            (``RolloutSample.token_versions``; ``rollout/partial_responses``,
            ``rollout/token_staleness``). A group's first tokens stay its oldest, so k
            bounds every trained token. Needs a backend that can end a generation early
            with its tokens (``RolloutBackend.preempt``: in-process, vLLM, LMDeploy).
        groups_in_flight: with k >= 2, how many groups the producer generates at once per
            rank (its worker threads; default 1). More keeps a server's batch full while
            single groups wait on their longest response; needs a backend whose
            ``generate`` may run on several threads at once (the server backends).
    """

    max_staleness: int = 0
    partial_rollout: bool = False
    groups_in_flight: int = 1

    def __post_init__(self) -> None:
        k = self.max_staleness
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ValueError(
                f'train_cfg.max_staleness must be an int >= 0, got {k!r}: 0 generates, then '
                'trains; 1 generates the next batch while this one trains; k >= 2 streams '
                'groups up to k batches ahead (the most weight versions a trained response '
                'may be behind)')
        if self.groups_in_flight < 1:
            raise ValueError(f'train_cfg.groups_in_flight must be >= 1, got '
                             f'{self.groups_in_flight}')
        if k < 2 and (self.partial_rollout or self.groups_in_flight != 1):
            raise ValueError(
                'train_cfg.partial_rollout and groups_in_flight apply to the streaming stage '
                f'(max_staleness >= 2); with max_staleness={k} every batch is generated by '
                'one call: set max_staleness >= 2 or leave them at False and 1')


@dataclass(frozen=True)
class TrainCfg:
    """The RL loop's ``train_cfg``, checked (keys and defaults as the config takes them).

    Attributes:
        max_steps: RL steps to run (>= 1); required.
        rollout: rollout-backend config (:data:`~gepo_xtuner.registry.ROLLOUT_BACKENDS`);
            required.
        advantage: advantage-processor config (:data:`~gepo_xtuner.registry.ADVANTAGES`);
            required.
        rewards: domain -> reward config (:class:`~gepo_xtuner.reward.RewardRouter`);
            required.
        num_responses: K, responses per prompt (>= 1).
        sampling: :class:`~gepo_xtuner.rollout.SamplingParams` fields except ``n`` (which
            is ``num_responses``); ``stop_token_ids`` defaults to the tokenizer's EOS. The
            trainer scores responses under ``softmax(logits / temperature)``, so
            ``top_p`` < 1, ``top_k`` > 0 and greedy decoding (temperature 0) are refused.
        prompt_template: ``str.format`` template applied to each record's ``prompt``
            (records with chat ``messages`` use the tokenizer's chat template; records
            with ``images`` go through the policy's processor, ``docs/multimodal.md``).
        val: held-out validation (:class:`~gepo_xtuner.engine.step.validation.ValSettings`:
            files and benchmarks, their sampling, ``interval``); None: none.
        reward_route_by: the record field that picks the reward function, ``'domain'``
            or ``'data_source'``.
        prompts_per_step: the intended prompts per RL step over all ranks; when set, a
            world size that does not split it evenly is refused.
        minibatch_responses: the intended responses per optimizer step over all ranks;
            checked like ``prompts_per_step``.
        behaviour_correction: the importance weight between the recomputed (proximal)
            old policy and the policy that sampled: ``'auto'`` (``'truncate'`` with
            ``max_staleness`` >= 1, else ``'none'``), ``'none'``, per token ``'truncate'``
            or ``'mask'``, per response (product of the token weights, as TRL's
            ``vllm_importance_sampling_mode``) ``'sequence_truncate'`` or
            ``'sequence_mask'``, per response (their geometric mean, as GSPO)
            ``'geometric_truncate'`` or ``'geometric_mask'``
            (:class:`~gepo_xtuner.engine.step.update.UpdateSettings`, which holds the
            resolved value and the formulas; ``behaviour_veto`` adds to any of them).
            Needs the rollout's logprobs at the sampling temperature
            (:meth:`check_backend`).
        entropy_logprobs: which sampled-token logprobs give GEPO's group entropy (and
            any processor's ``AdvantageInputs.logprobs``): ``'proximal'`` (the
            recomputed old logprobs, the policy being shaped) or ``'behaviour'`` (the
            rollout engine's, the policy that sampled); ``docs/training.md``.
        update: how the trainer side runs; its keys (``minibatch_responses_per_rank``,
            ``ppo_epochs``, ...) are ``train_cfg`` keys of their own
            (:class:`~gepo_xtuner.engine.step.update.UpdateSettings`).
        stage: how rollouts are produced; its keys (``max_staleness``) are ``train_cfg``
            keys of their own (:class:`StageSettings`).
        stop_token_ids: the configured ``sampling.stop_token_ids``; None: the
            tokenizer's EOS (:meth:`sampling_for`). Derived.
    """

    max_steps: int
    rollout: dict
    advantage: dict
    rewards: dict
    num_responses: int = 8
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(n=8))
    prompt_template: str = '{prompt}'
    val: ValSettings | None = None
    reward_route_by: str = 'domain'
    prompts_per_step: int | None = None
    minibatch_responses: int | None = None
    behaviour_correction: str = 'auto'
    entropy_logprobs: str = 'proximal'
    update: UpdateSettings = field(default_factory=UpdateSettings, metadata=PART)
    stage: StageSettings = field(default_factory=StageSettings, metadata=PART)
    stop_token_ids: tuple[int, ...] | None = field(default=None, metadata=DERIVED)

    # -- the keys --------------------------------------------------------------------------
    @classmethod
    def _key_fields(cls) -> dict[str, tuple[str | None, dataclasses.Field]]:
        """``key -> (part field or None, the field that owns the key)``."""
        out: dict[str, tuple[str | None, dataclasses.Field]] = {}
        for f in dataclasses.fields(cls):
            if f.metadata.get('part'):
                for sub in dataclasses.fields(_PARTS[f.name]):
                    if sub.metadata.get('key', True):
                        out[sub.name] = (f.name, sub)
            elif f.metadata.get('key', True):
                out[f.name] = (None, f)
        return out

    @classmethod
    def keys(cls) -> list[str]:
        """Every ``train_cfg`` key (``type`` aside)."""
        return list(cls._key_fields())

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """``key -> default`` as the config writes it (``sampling``: ``{}``)."""
        out: dict[str, Any] = {}
        for key, (_, f) in cls._key_fields().items():
            if key in _RAW_DEFAULTS:
                out[key] = _RAW_DEFAULTS[key]
            elif f.default is not dataclasses.MISSING:
                out[key] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[key] = f.default_factory()
        return out

    @classmethod
    def help(cls) -> dict[str, str]:
        """``key -> help text``, from the docstring of the class that owns the key."""
        docs = {None: docstring_attributes(cls)}
        docs.update({name: docstring_attributes(part) for name, part in _PARTS.items()})
        return {key: docs[part].get(key, '') for key, (part, _) in cls._key_fields().items()}

    @classmethod
    def check_keys(cls, keys: Iterable[str]) -> None:
        """Refuses keys ``train_cfg`` does not take (``type`` is the loop's).

        Raises:
            TypeError: each unknown key with the key that replaced it
                (:data:`RENAMED_KEYS`) or the closest accepted key.
        """
        refuse_unknown('train_cfg', [k for k in keys if k != 'type'], cls.keys(), RENAMED_KEYS)

    # -- building --------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any]) -> 'TrainCfg':
        """Checks a config's ``train_cfg`` and builds the object (defaults for the keys it
        omits).

        Raises:
            TypeError: an unknown key, a missing required one, or a value of the wrong
                type, naming the key.
            ValueError: a value the loop does not take, naming the key and what to use.
        """
        cfg = {k: v for k, v in dict(cfg).items() if k != 'type'}
        cls.check_keys(cfg)
        fields = cls._key_fields()
        missing = [k for k, (part, f) in fields.items() if part is None
                   and cfg.get(k) is None and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise TypeError(f'train_cfg needs {", ".join(missing)}')
        values = {**cls.defaults(), **cfg}
        check_types('train_cfg', cls, {k: v for k, v in values.items()
                                       if fields[k][0] is None and k not in ('sampling', 'val')})
        for name, part in _PARTS.items():
            check_types('train_cfg', part, {k: v for k, v in values.items()
                                            if fields[k][0] == name})
        if min(values['max_steps'], values['num_responses']) < 1:
            raise ValueError('train_cfg.max_steps and train_cfg.num_responses must be >= 1, '
                             f'got {values["max_steps"]}, {values["num_responses"]}')
        if values['entropy_logprobs'] not in ('proximal', 'behaviour'):
            raise ValueError("train_cfg.entropy_logprobs must be 'proximal' or 'behaviour', "
                             f'got {values["entropy_logprobs"]!r}')
        if values['reward_route_by'] not in ('domain', 'data_source'):
            raise ValueError("train_cfg.reward_route_by must be 'domain' or 'data_source', "
                             f'got {values["reward_route_by"]!r}')
        for key in ('prompts_per_step', 'minibatch_responses'):
            if values[key] is not None and values[key] < 1:
                raise ValueError(f'train_cfg.{key} must be >= 1 or None, got {values[key]!r}')
        sampling, stop = _sampling(values['sampling'], values['num_responses'])
        part = {name: {k: v for k, v in values.items() if fields[k][0] == name}
                for name in _PARTS}
        stage = _PARTS['stage'](**part['stage'])
        correction = resolve_behaviour_correction(values['behaviour_correction'],
                                                  stage.max_staleness)
        update = _PARTS['update'](**{
            **part['update'],
            # every logprob of the step is one of softmax(logits / temperature), and the
            # loss's constant length defaults to the generation cap
            'temperature': sampling.temperature,
            'norm_length': (sampling.max_new_tokens if values['norm_length'] is None
                            else values['norm_length']),
            'behaviour_correction': correction})
        val = values['val']
        own = {k: v for k, v in values.items() if fields[k][0] is None}
        return cls(**{**own, 'sampling': sampling, 'stop_token_ids': stop,
                      'val': ValSettings.from_dict(val) if val else None,
                      'update': update, 'stage': stage})

    def sampling_for(self, eos_token_id: int) -> SamplingParams:
        """The run's sampling parameters: the configured stop ids, else the tokenizer's
        ``eos_token_id``."""
        stop = self.stop_token_ids if self.stop_token_ids is not None else (eos_token_id, )
        return replace(self.sampling, stop_token_ids=stop)

    def check_backend(self, rollout: Any) -> float:
        """The refusals that need the built rollout backend: generation ahead that it
        cannot do, logprobs at a temperature an off-policy correction cannot use.

        Returns:
            The temperature of the backend's logprobs for this sampling.

        Raises:
            ValueError: saying why and what to change.
        """
        if self.stage.max_staleness:
            rollout.check_overlap()
        if self.stage.partial_rollout:
            rollout.check_partial()
        if self.stage.groups_in_flight > 1 and not rollout.concurrent_generate:
            raise ValueError(
                f'train_cfg.groups_in_flight={self.stage.groups_in_flight} needs a rollout '
                f'backend whose generate may run on several threads at once; '
                f'{type(rollout).__name__} generates one call at a time: set '
                'groups_in_flight=1 (a server backend can take more)')
        temperature = rollout.logprob_temperature(self.sampling)
        refusal = behaviour_refusal(temperature, self.sampling,
                                    self.update.behaviour_correction, self.entropy_logprobs,
                                    self.update.behaviour_veto)
        if refusal is not None:
            raise ValueError(refusal)
        return temperature


#: part field -> its class
_PARTS: dict[str, type] = {'update': UpdateSettings, 'stage': StageSettings}
#: keys whose config form differs from the typed default
_RAW_DEFAULTS: dict[str, Any] = {'sampling': {}}


def _sampling(cfg: Mapping[str, Any] | None, n: int
              ) -> tuple[SamplingParams, tuple[int, ...] | None]:
    """``train_cfg.sampling`` as :class:`~gepo_xtuner.rollout.SamplingParams` (``n`` set,
    no stop ids) and the configured stop ids (None: the tokenizer's EOS)."""
    if cfg is not None and not isinstance(cfg, Mapping):
        raise TypeError(f'train_cfg.sampling must be a dict of SamplingParams fields, got '
                        f'{cfg!r}')
    cfg = dict(cfg or {})
    refuse_unknown('train_cfg.sampling', cfg, [f.name for f in dataclasses.fields(SamplingParams)])
    if cfg.get('n', n) != n:
        raise ValueError(f'train_cfg.sampling.n is {cfg["n"]!r} but train_cfg.num_responses is '
                         f'{n}: the group size is num_responses; leave sampling.n out')
    stop = cfg.pop('stop_token_ids', None)
    params = SamplingParams(**{**cfg, 'n': n, 'stop_token_ids': ()})
    check_training_sampling(params)
    return params, None if stop is None else tuple(stop)
