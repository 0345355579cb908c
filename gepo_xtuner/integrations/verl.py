"""GEPO for verl 0.9: the ``gepo`` advantage estimator, over any of verl's outcome estimators.

verl loads this module as a plugin (the ``verl.plugins`` entry point this package installs)
when ``verl`` is imported. A run then asks for GEPO in its algorithm section::

    python -m verl.trainer.main_ppo algorithm.adv_estimator=gepo \\
        +algorithm.gepo.base=grpo +algorithm.gepo.gamma=1.0 ...

``algorithm.gepo`` (optional; the paper's values by default):

- ``base``: the verl estimator whose advantages are shaped (``grpo`` by default; any one
  registered with ``register_adv_est`` that gives one advantage per response, e.g. ``rloo``,
  ``grpo_vectorized``, ``reinforce_plus_plus_baseline``; ``norm_adv_by_std_in_grpo`` applies
  as usual). Token-level estimators (``gae``) are refused: GEPO scales a response's advantage.
- ``logprobs``: whose per-token logprobs measure a group's entropy: ``rollout`` (the rollout
  engine's, ``rollout_log_probs``, kept with ``actor_rollout_ref.rollout.calculate_log_probs``),
  ``old`` (the actor's recomputation, ``old_log_probs``) or ``auto`` (rollout where present).
- ``alpha_low``, ``alpha_high``, ``beta_low``, ``beta_high``, ``gamma``, ``eps``:
  :class:`~gepo_xtuner.advantage.GEPOAdvantage`'s.

Bases that need inputs verl prepares only when they are the run's own estimator (``remax``'s
``reward_baselines``, the optimal-token baselines' ``sum_pi_squared``) are refused.

Why a wrapper and not only a registered estimator: verl calls a registered estimator with the
rewards, the response mask and the group ids, never with the logprobs, which are in the batch
when verl's ``compute_advantage`` runs. This plugin therefore

1. registers ``gepo`` with ``register_adv_est`` (so the name is known; called on its own it
   raises and says why);
2. replaces ``verl.trainer.ppo.ray_trainer.compute_advantage`` as that module finishes
   loading, before any trainer imports it by name (the legacy and v1 trainers do): for ``gepo`` it runs verl's own ``compute_advantage`` with the base estimator, then
   shapes ``advantages`` (and ``returns``, which verl's outcome estimators set equal) with one
   band update over the whole batch (verl computes advantages on the driver, on the whole
   batch: groups are ``non_tensor_batch['uid']``, wherever their rows sit);
3. adds the ``gepo/*`` and ``shaping/*`` figures of the step to what
   ``compute_data_metrics`` returns (so they reach verl's logger with the step's metrics);
4. saves the band into each checkpoint, ``global_step_N/gepo_state.json`` (written
   atomically before verl writes the rest), and restores it when a run resumes from
   ``global_step_N``; a checkpoint without it is refused, since the band would restart.

Modules are patched as they finish loading (an import hook); modules loaded before the plugin
are patched when it installs. verl swallows a plugin's import error (it logs it at DEBUG
level), and a run then only says the estimator is unknown:
``VERL_USE_EXTERNAL_MODULES=gepo_xtuner.integrations.verl`` makes verl import it and raise.

Not covered: the fully asynchronous trainer (``verl.experimental.fully_async_policy``) writes
its own checkpoints, without the band (a resume there restarts it); v1's multi-turn sessions
(``compute_advantage_for_multi_trajectories``) give every output of a session its own row in
the base and in the group entropy, where verl's ``grpo`` scores the last output and copies it;
v1's ``separate_async`` mode computes advantages per parameter-sync chunk, one band update each.
"""

from __future__ import annotations

import importlib.abc
import inspect
import importlib.machinery
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from ..advantage import AdvantageInputs, AdvantageOutput, EntropyThresholdState, GEPOAdvantage
from ..atomic_io import atomic_write_json
from ..ops.distributed import replicated_batch

__all__ = ['ESTIMATOR', 'STATE_FILE', 'GEPOVerl', 'install', 'runtime']

#: The estimator's name in ``algorithm.adv_estimator``.
ESTIMATOR = 'gepo'
#: The band, in each ``global_step_N`` checkpoint folder.
STATE_FILE = 'gepo_state.json'
_LOGPROB_SOURCES = ('auto', 'rollout', 'old')
#: verl estimators whose inputs verl makes only when they are ``adv_estimator`` itself
_NEEDS_OWN_INPUTS = ('remax', 'optimal_token_baseline', 'tir_optimal_token_baseline')
#: Relative spread under which a response's token advantages count as one value.
_CONSTANT_RTOL = 1e-5


def _name(estimator: Any) -> str:
    return str(getattr(estimator, 'value', estimator))


def _settings(config: Any) -> dict[str, Any]:
    """``algorithm.gepo`` as a plain dict (DictConfig, dataclass config or dict)."""
    section = None if config is None else config.get('gepo', None)
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        try:
            from omegaconf import OmegaConf
            section = OmegaConf.to_container(section, resolve=True)
        except (ImportError, ValueError):
            section = dict(section)
    return dict(section)


class GEPOVerl:
    """The GEPO shaper of one verl run (the driver process holds one).

    Args:
        base: verl's estimator whose per-response advantages are shaped.
        logprobs: ``auto``, ``rollout`` or ``old`` (see module).
        **gepo: :class:`~gepo_xtuner.advantage.GEPOAdvantage`'s arguments.

    Attributes:
        gepo: the processor; state: its band; last: the last step's output;
        pending_metrics: the last step's figures, until verl's metrics collect them.
    """

    def __init__(self, base: str = 'grpo', logprobs: str = 'auto', **gepo: Any) -> None:
        base = _name(base)
        if base in _NEEDS_OWN_INPUTS:
            raise ValueError(
                f'algorithm.gepo.base={base!r}: verl prepares its inputs only when it is the '
                'run\'s adv_estimator; choose grpo, rloo, grpo_vectorized or '
                'reinforce_plus_plus_baseline')
        if base in (ESTIMATOR, 'gae'):
            raise ValueError(
                f'algorithm.gepo.base={base!r}: GEPO shapes one advantage per response, from an '
                'outcome estimator such as grpo, rloo, grpo_vectorized or '
                'reinforce_plus_plus_baseline' + (' (gae gives one per token)' if base == 'gae'
                                                  else ''))
        if logprobs not in _LOGPROB_SOURCES:
            raise ValueError(f'algorithm.gepo.logprobs={logprobs!r}: one of {_LOGPROB_SOURCES}')
        self.base, self.logprobs = base, logprobs
        self.settings = dict(base=base, logprobs=logprobs, **gepo)
        try:
            self.gepo = GEPOAdvantage(**gepo)
        except TypeError as err:  # an unknown field, or a value of the wrong type
            raise ValueError(
                f'algorithm.gepo: {err}; its fields are base, logprobs and GEPOAdvantage\'s '
                '(alpha_low, alpha_high, beta_low, beta_high, gamma, eps), numbers') from None
        self.state: EntropyThresholdState = self.gepo.init_state()
        self.last: AdvantageOutput | None = None
        self.pending_metrics: dict[str, float] = {}

    @classmethod
    def from_config(cls, config: Any) -> GEPOVerl:
        """From verl's ``algorithm`` section (its ``gepo`` sub-section)."""
        return cls(**_settings(config))

    # -- the shaping -------------------------------------------------------------------
    def logprob_field(self, fields: Any) -> str:
        """The batch field the group entropy is measured from."""
        if self.logprobs == 'rollout' or (self.logprobs == 'auto' and
                                          'rollout_log_probs' in fields):
            if 'rollout_log_probs' not in fields:
                raise KeyError(
                    'algorithm.gepo.logprobs=rollout, but the batch has no rollout_log_probs: '
                    'set actor_rollout_ref.rollout.calculate_log_probs=True')
            return 'rollout_log_probs'
        if 'old_log_probs' not in fields:
            raise KeyError(
                'GEPO measures group entropy from the sampling policy\'s logprobs, and the batch '
                'has neither rollout_log_probs (actor_rollout_ref.rollout.calculate_log_probs='
                'True) nor old_log_probs')
        return 'old_log_probs'

    def __call__(self, data: Any) -> Any:
        """Shape a ``DataProto`` whose ``advantages`` the base estimator has just set.

        Args:
            data: verl's batch: ``batch['advantages']`` ``(N, T)`` (a response's value on
                each of its tokens), ``batch['response_mask']`` ``(N, T)``, the logprobs
                ``(N, T)`` and ``batch['token_level_rewards']``; ``non_tensor_batch['uid']``
                ``(N,)``, the prompt of each response.

        Returns:
            ``data``, with ``advantages`` (and ``returns`` where they equalled them) shaped:
            ``A'_i = f_g(A_i) * response_mask``, one band update.
        """
        fields = data.batch.keys()
        mask = data.batch['response_mask'].bool()
        adv = data.batch['advantages']
        per_response = _per_response(adv, mask)
        field = self.logprob_field(fields)
        uid = data.non_tensor_batch.get('uid')
        if uid is None:
            raise KeyError('GEPO groups responses by prompt: the batch has no '
                           "non_tensor_batch['uid']")
        index = {key: i for i, key in enumerate(dict.fromkeys(uid.tolist()))}
        batch = AdvantageInputs(
            rewards=data.batch['token_level_rewards'].sum(-1).to('cpu', torch.float64),
            group_ids=torch.tensor([index[key] for key in uid.tolist()]),
            logprobs=data.batch[field].detach().to('cpu', torch.float32),
            mask=mask.cpu())
        with replicated_batch():  # the driver holds the whole batch
            self.last = self.gepo(batch, self.state, base_advantages=per_response.cpu())
        shaped = self.last.advantages.to(adv.device, adv.dtype).unsqueeze(-1) * mask.to(adv.dtype)
        if 'returns' in fields and torch.equal(data.batch['returns'], adv):
            data.batch['returns'] = shaped.clone()
        data.batch['advantages'] = shaped
        self.pending_metrics = {key: float(value) for key, value in self.last.metrics.items()
                                if key.startswith(('gepo/', 'shaping/'))}
        return data

    # -- the band in verl's checkpoints ------------------------------------------------
    def save(self, folder: str) -> str:
        """Write the band into ``folder`` atomically; returns the file's path."""
        path = os.path.join(folder, STATE_FILE)
        atomic_write_json(path, dict(settings=self.settings, state=self.state.state_dict()))
        return path

    def load(self, folder: str) -> None:
        """Restore the band saved in ``folder``.

        Raises:
            FileNotFoundError: the checkpoint has no band.
        """
        path = os.path.join(folder, STATE_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f'{folder} has no {STATE_FILE}: it was not written by a run with '
                f'adv_estimator={ESTIMATOR}, and resuming would restart the entropy band; start '
                'a new run from its weights instead (merge the actor checkpoint with '
                'verl.model_merger, then actor_rollout_ref.model.path=...)')
        with open(path, encoding='utf-8') as f:
            saved = json.load(f)
        if saved.get('settings', self.settings) != self.settings:
            raise ValueError(f'{path} was written with algorithm.gepo {saved["settings"]}, and '
                             f'this run has {self.settings}: resume with the same settings')
        self.state.load_state_dict(saved['state'])


def _per_response(adv: Tensor, mask: Tensor) -> Tensor:
    """``(N,)`` the value each response's tokens carry; refuses token-level advantages."""
    masked = torch.where(mask, adv, torch.zeros((), dtype=adv.dtype, device=adv.device))
    count = mask.sum(-1).clamp(min=1)
    value = masked.sum(-1) / count
    spread = (torch.where(mask, adv - value.unsqueeze(-1), torch.zeros_like(adv)).abs()
              .amax(-1) if adv.numel() else value)
    if bool((spread > _CONSTANT_RTOL * value.abs().clamp(min=1.0)).any()):
        raise ValueError(
            'GEPO scales one advantage per response, and the base estimator gave advantages '
            'that vary along a response: choose an outcome estimator as algorithm.gepo.base')
    return value.float()


# -- the run's shaper ---------------------------------------------------------------------
_RUNTIME: GEPOVerl | None = None


def runtime(config: Any = None) -> GEPOVerl:
    """This process's shaper, made from ``config`` (verl's ``algorithm``) on first use.

    Raises:
        ValueError: ``config`` asks for other settings than the shaper was made with.
    """
    global _RUNTIME
    if _RUNTIME is None:
        _RUNTIME = GEPOVerl.from_config(config)
    elif config is not None:
        wanted = GEPOVerl(**_settings(config)).settings
        if wanted != _RUNTIME.settings:
            raise ValueError(f'algorithm.gepo changed during the run: {_RUNTIME.settings} '
                             f'then {wanted}')
    return _RUNTIME


def _reset_runtime() -> None:
    global _RUNTIME
    _RUNTIME = None


def _estimator_called_alone(**kwargs: Any) -> Any:
    raise RuntimeError(
        f'the {ESTIMATOR!r} estimator needs the batch\'s logprobs, which verl only passes to '
        'compute_advantage: this call came from elsewhere. gepo_xtuner.integrations.verl '
        'wraps verl.trainer.ppo.ray_trainer.compute_advantage when verl loads it; call that')


# -- the patches ----------------------------------------------------------------------------
def _wrap_compute_advantage(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    def compute_advantage(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
        if _name(adv_estimator) != ESTIMATOR:
            return original(data, adv_estimator, *args, **kwargs)
        config = signature.bind(data, adv_estimator, *args, **kwargs).arguments.get('config')
        shaper = runtime(config)
        return shaper(original(data, shaper.base, *args, **kwargs))

    compute_advantage.__wrapped__ = original  # type: ignore[attr-defined]
    compute_advantage.__doc__ = original.__doc__
    compute_advantage.gepo = True  # type: ignore[attr-defined]
    return compute_advantage


def _wrap_data_metrics(original: Callable[..., Any]) -> Callable[..., Any]:
    def compute_data_metrics(*args: Any, **kwargs: Any) -> dict[str, Any]:
        metrics = original(*args, **kwargs)
        if _RUNTIME is not None and _RUNTIME.pending_metrics:
            metrics.update(_RUNTIME.pending_metrics)
            _RUNTIME.pending_metrics = {}
        return metrics

    compute_data_metrics.__wrapped__ = original  # type: ignore[attr-defined]
    compute_data_metrics.gepo = True  # type: ignore[attr-defined]
    return compute_data_metrics


def _uses_gepo(trainer: Any) -> bool:
    return _name(trainer.config.algorithm.get('adv_estimator', '')) == ESTIMATOR


def _step_folder(trainer: Any) -> str:
    """``global_step_N`` of the trainer's checkpoints, as verl names it."""
    tconf = trainer.config.trainer
    if tconf.get('resume_mode', 'auto') == 'resume_path' and tconf.get('resume_from_path'):
        folder = tconf.resume_from_path
    else:
        folder = os.path.join(tconf.default_local_dir, f'global_step_{trainer.global_steps}')
    return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)


def _patch_trainer(cls: type) -> None:
    """Band into and out of ``cls``'s checkpoints (its own methods, once)."""
    if getattr(cls._save_checkpoint, 'gepo', False):
        return
    save, load = cls._save_checkpoint, cls._load_checkpoint

    def _save_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _uses_gepo(self):  # first: a checkpoint verl marks as done already has the band
            runtime(self.config.algorithm).save(
                os.path.join(self.config.trainer.default_local_dir,
                             f'global_step_{self.global_steps}'))
        return save(self, *args, **kwargs)

    def _load_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = load(self, *args, **kwargs)
        if _uses_gepo(self) and self.global_steps:
            runtime(self.config.algorithm).load(_step_folder(self))
        return out

    _save_checkpoint.gepo = _load_checkpoint.gepo = True  # type: ignore[attr-defined]
    cls._save_checkpoint, cls._load_checkpoint = _save_checkpoint, _load_checkpoint


def _patch_metric_utils(module: Any) -> None:
    if not getattr(module.compute_data_metrics, 'gepo', False):
        module.compute_data_metrics = _wrap_data_metrics(module.compute_data_metrics)


def _patch_ray_trainer(module: Any) -> None:
    if not getattr(module.compute_advantage, 'gepo', False):
        module.compute_advantage = _wrap_compute_advantage(module.compute_advantage)
    _patch_metric_utils(module)  # its own binding, if it imported the original first
    _patch_trainer(module.RayPPOTrainer)


def _patch_v1_trainer(module: Any) -> None:
    _patch_metric_utils(module)
    _patch_trainer(module.PPOTrainer)


def _patch_core_algos(module: Any) -> None:
    if ESTIMATOR not in module.ADV_ESTIMATOR_REGISTRY:
        module.register_adv_est(ESTIMATOR)(_estimator_called_alone)


#: verl's modules this plugin changes, and how.
PATCHES: dict[str, Callable[[Any], None]] = {
    'verl.trainer.ppo.core_algos': _patch_core_algos,
    'verl.trainer.ppo.metric_utils': _patch_metric_utils,
    'verl.trainer.ppo.ray_trainer': _patch_ray_trainer,
    'verl.trainer.ppo.v1.trainer_base': _patch_v1_trainer,
}


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[Any], None]) -> None:
        self.loader, self.patch = loader, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        self.patch(module)

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, is_package, ...
        return getattr(self.loader, name)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds :data:`PATCHES`' modules with the other finders, patches them once loaded."""

    def __init__(self) -> None:
        self._finding: set[str] = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        patch = PATCHES.get(name)
        if patch is None or name in self._finding:  # another finder asking the path again
            return None
        self._finding.add(name)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, 'find_spec'):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    if spec.loader is not None:
                        spec.loader = _PatchingLoader(spec.loader, patch)
                    return spec
            return None
        finally:
            self._finding.discard(name)


def install() -> None:
    """Register ``gepo`` with verl and patch its modules: as they load, and those loaded."""
    if not any(isinstance(f, _PatchingFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchingFinder())
    loaded = {name: sys.modules[name] for name in PATCHES if name in sys.modules}
    originals = {}
    for name, module in loaded.items():
        before = {attr: getattr(module, attr, None)
                  for attr in ('compute_advantage', 'compute_data_metrics')}
        PATCHES[name](module)
        originals.update({id(fn): getattr(module, attr) for attr, fn in before.items()
                          if fn is not None and getattr(module, attr) is not fn})
    if originals:  # modules that had imported an original by name before this ran
        for name, module in list(sys.modules.items()):
            if not name.startswith('verl.') or module is None:
                continue
            for attr in ('compute_advantage', 'compute_data_metrics'):
                replacement = originals.get(id(getattr(module, attr, None)))
                if replacement is not None:
                    setattr(module, attr, replacement)


install()
