#!/usr/bin/env python
"""Check RL configs before a cluster run: load, build what needs no weights or data, report.

Usage::

    python tools/check_config.py CONFIG [CONFIG ...] [--world-size N] [--no-path-check]
        [--cfg-options key=value ...] [--json]
    python tools/check_config.py CONFIG --smoke-steps N [--nproc P] [--work-dir DIR]
        [--max-new-tokens T] [--cfg-options key=value ...]

For each config: lists its config variables (the ``{{$VAR:default}}`` environment
variables of the file and its bases, with their values and where they came from),
loads it with mmengine (after importing ``gepo_xtuner``), builds the advantage
processor, policy loss, rewards, rollout backend (its constructor starts nothing),
sampling parameters, hooks and log processor, checks the remaining types and
arguments against their registries and signatures without building them (no model
weights, no dataset reads), checks that model and data paths exist, and prints what
would run: paths, algorithm and hyperparameters, K, prompts and responses per rank and
in total, optimizer steps per RL step, loss, rollout backend, world size.

``--world-size N`` sets ``WORLD_SIZE`` for loading, as torchrun does for each training
process (the paper configs split their global batch by it).

Smoke mode, ``--smoke-steps N [--nproc P] [--work-dir DIR]`` (one config): runs N real RL
steps of the config on CPU through XTuner's training program (``python -m
xtuner.tools.train``, under torchrun for P > 1), with the model swapped for a tiny random
one of the same family, a small generated record set for the config's reward domains,
batches scaled down with the structure kept (K, minibatches per rollout batch,
micro-batches, P ranks), the in-process ``HFRolloutBackend`` instead of LMDeploy, gloo
and float32 (see :mod:`gepo_xtuner.testbed.smoke`). No weights or data are needed. The last
stdout line is a JSON object with the last step's logged metrics; on failure the tail
of the training log is printed and the exit status is 1.

Exit status: 0 if every config passed, 1 if any did not (each problem is printed as
``CONFIG: problem``), 2 for a usage error.
"""

import argparse
import ast
import importlib.util
import inspect
import json
import logging
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The package of this checkout, whatever else is installed: the tool checks its own tree.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HUB_ID = re.compile(r'[\w.-]+(/[\w.-]+)?')  # 'org/name' or 'name'; anything else is a path
ENV_PATTERN = re.compile(r'\{\{[\'"]?\s*\$(\w+)\s*:\s*(\S*?)\s*[\'"]?\}\}')  # mmengine's syntax
LAUNCH_NOTE = ('half-precision weights: launch with `--deepspeed deepspeed_zero2` (mmengine\'s '
               'FlexibleRunner + DeepSpeed ZeRO-2, fp32 master weights, replace runner and '
               'optimizer wrapper)')


@dataclass
class ConfigVar:
    """One ``{{$NAME:default}}`` of a config file or one of its bases."""

    name: str
    default: str
    file: str
    line: int
    description: str

    @property
    def value(self) -> str | None:
        return os.environ.get(self.name, self.default or None)

    @property
    def source(self) -> str:
        if self.name in os.environ:
            return 'environment'
        return 'default' if self.default else 'UNSET'


def base_files(path: Path) -> list[Path]:
    """The ``_base_`` files of a config, relative to its directory (not recursive)."""
    tree = ast.parse(path.read_text(encoding='utf-8'), filename=str(path))
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == '_base_'):
            value = ast.literal_eval(node.value)
            names = [value] if isinstance(value, str) else list(value)
            return [(path.parent / name).resolve() for name in names]
    return []


def config_variables(path: Path, seen: set[Path] | None = None) -> list[ConfigVar]:
    """Environment variables a config reads, bases first, each name once."""
    seen = set() if seen is None else seen
    if path in seen:
        return []
    seen.add(path)
    found: list[ConfigVar] = []
    for base in base_files(path):
        found += config_variables(base, seen)
    for lineno, text in enumerate(path.read_text(encoding='utf-8').splitlines(), start=1):
        for match in ENV_PATTERN.finditer(text):
            rest = text[match.end():]
            comment = rest.split('#', 1)[1].strip() if '#' in rest else ''
            found.append(ConfigVar(match.group(1), match.group(2), str(path), lineno, comment))
    unique: dict[str, ConfigVar] = {}
    for var in found:
        unique.setdefault(var.name, var)
    return list(unique.values())


def describe(cfg: dict, cls: type | None = None) -> str:
    """``Type a=1 b=2`` with the class's defaults filled in for arguments not given."""
    args = {k: v for k, v in cfg.items() if k != 'type'}
    if cls is not None:
        for name, param in inspect.signature(cls).parameters.items():
            if param.default is not inspect.Parameter.empty and name not in args:
                args[name] = param.default
    shown = ' '.join(f'{k}={v!r}' for k, v in args.items())
    return f'{cfg.get("type")} {shown}'.strip()


class Checker:
    """Runs the checks of one loaded config and collects rows, problems and warnings."""

    def __init__(self, cfg, variables: list[ConfigVar], world_size: tuple[int, str],
                 check_paths: bool) -> None:
        self.cfg = cfg
        self.variables = variables
        self.world_size, self.world_source = world_size
        self.check_paths = check_paths
        self.rows: dict[str, str] = {}
        self.inputs = None  # the policy's PolicyInputs, when its directories are here
        self.config_json: dict | None = None  # the policy's config.json, when it is here
        self.problems: list[str] = []
        self.warnings: list[str] = []

    # ---- helpers ----
    def problem(self, where: str, exc: BaseException | str) -> None:
        text = exc if isinstance(exc, str) else f'{type(exc).__name__}: {exc}'
        self.problems.append(f'{where}: {text}')

    def resolve(self, registry, cfg: dict | None, where: str) -> type | None:
        """The class a ``dict(type=...)`` names, or None (recorded as a problem)."""
        if not isinstance(cfg, dict) or 'type' not in cfg:
            self.problem(where, f'expected a dict with a `type`, got {cfg!r}')
            return None
        cls = registry.get(cfg['type']) if isinstance(cfg['type'], str) else cfg['type']
        if cls is None:
            self.problem(where, f"unresolved type {cfg['type']!r}: nothing of that name is "
                         f'registered in the {registry.name} registry by this installation '
                         '(is gepo_xtuner up to date?)')
        return cls

    def bind(self, cls: type, cfg: dict, where: str, *leading: Any) -> None:
        """Checks the arguments against the constructor without calling it."""
        args = {k: v for k, v in cfg.items() if k != 'type'}
        try:
            inspect.signature(cls).bind(*leading, **args)
            if hasattr(cls, 'check_keys'):  # a class taking **unknown to refuse them itself
                cls.check_keys(args)
        except TypeError as exc:
            self.problem(where, f'{cls.__name__}: {exc}')

    def build(self, registry, cfg: dict | None, where: str) -> Any:
        cls = self.resolve(registry, cfg, where)
        if cls is None:
            return None
        try:
            return registry.build(cfg)
        except Exception as exc:  # noqa: BLE001 (report every build error, then go on checking)
            self.problem(where, exc)
            return None

    def var_for(self, value: str) -> str:
        for var in self.variables:
            if var.value and len(var.value) > 1 and value.startswith(var.value):
                return var.name
        return ''

    def path(self, value: Any, where: str, kind: str) -> str:
        """Describes a model directory or data file; records a problem if it is missing."""
        if not isinstance(value, str) or not value:
            self.problem(where, f'expected a path, got {value!r}')
            return repr(value)
        var = self.var_for(value)
        hint = f' (from {var}: set {var} to the right location)' if var else ''
        path = Path(value)
        if (kind == 'model' and HUB_ID.fullmatch(value) and not value.startswith('.')
                and not path.exists()):
            return f'{value} [hub id: downloaded at build time, not checked]'
        if not self.check_paths:
            return f'{value} [not checked]'
        if kind == 'file' and not path.is_file():
            self.problem(where, f'file {value} does not exist{hint}')
            return f'{value} [MISSING]'
        if kind == 'model' and not path.is_dir():
            self.problem(where, f'model directory {value} does not exist{hint}')
            return f'{value} [MISSING]'
        if kind == 'model':
            return f'{value} [{self.model_type(path, where)}]'
        return f'{value} [exists, {path.stat().st_size / 2**20:.1f} MiB]'

    def records(self, dataset: dict, where: str) -> str:
        """Checks every record of a reachable data file as the dataset will read it.

        The same schema checks as ``PromptDataset`` and validation, with the dataset's
        ``required``, ``fields`` and ``default_domain``; each bad record is a problem
        ``FILE:LINE: field X: reason; fix`` (at most 20 lines per file).
        """
        from gepo_xtuner.data.records import scan_file

        path = dataset.get('path')
        if not self.check_paths or not isinstance(path, str) or not Path(path).is_file():
            return ''
        try:
            count, problems = scan_file(path, required=tuple(dataset.get('required') or ()),
                                        fields=dataset.get('fields'),
                                        default_domain=dataset.get('default_domain'))
        except (TypeError, ValueError) as exc:  # a malformed fields / required option
            self.problem(where, exc)
            return ''
        if not problems:  # then against the policy: chat template, images
            from gepo_xtuner.data.inputs import scan_inputs
            problems, warnings = scan_inputs(
                path, self.inputs, required=tuple(dataset.get('required') or ()),
                fields=dataset.get('fields'), default_domain=dataset.get('default_domain'))
            self.warnings += [f'{where}: {w}' for w in warnings]
        for line in problems:
            self.problem(where, line)
        return f', {count} records' + (' checked' if not problems else ', BAD')

    def policy_inputs(self, model: dict) -> None:
        """What the policy reads, from its local directories as ``RLPolicy`` picks them:
        the processor (``model.processor``, else ``pretrained`` for a non-text model
        class) and the tokenizer (``model.tokenizer``, else the processor's, else
        ``pretrained``'s). Left None when one is not a local directory."""
        from gepo_xtuner.data.inputs import PolicyInputs
        from gepo_xtuner.model.policy import TEXT_MODEL_CLASS

        pretrained = model.get('pretrained')
        processor = model.get('processor') or (
            pretrained if model.get('model_class', TEXT_MODEL_CLASS) != TEXT_MODEL_CLASS else None)
        tokenizer = model.get('tokenizer') or processor or pretrained
        dirs = [d for d in (processor, tokenizer) if d is not None]
        if not self.check_paths or not all(isinstance(d, str) and Path(d).is_dir() for d in dirs):
            return
        found = [PolicyInputs.from_dir(d) for d in dict.fromkeys(dirs)]
        limits = found[0] if processor is not None else PolicyInputs('', False)
        self.inputs = PolicyInputs(' / '.join(dict.fromkeys(dirs)),
                                   any(f.chat_template for f in found), limits.min_side,
                                   limits.max_pixels)

    def model_type(self, path: Path, where: str) -> str:
        config = path / 'config.json'
        if not config.is_file():
            self.problem(where, f'{path} has no config.json: not a Hugging Face model directory')
            return 'no config.json'
        try:
            self.config_json = json.loads(config.read_text(encoding='utf-8'))
            model_type = self.config_json.get('model_type')
        except (OSError, ValueError) as exc:
            self.problem(where, f'{config} is not readable JSON ({exc})')
            return 'bad config.json'
        expected = self.cfg.get('policy_model_type')
        if expected and model_type != expected:
            self.warnings.append(f'{where}: {config} says model_type {model_type!r}, but this '
                                 f'config is for {self.cfg.get("policy_name")} ({expected!r})')
        return f'model_type {model_type}'

    # ---- the checks ----
    def run(self) -> None:
        from mmengine.registry import (
                                       DATA_SAMPLERS,
                                       DATASETS,
                                       FUNCTIONS,
                                       HOOKS,
                                       LOG_PROCESSORS,
                                       LOOPS,
                                       MODELS,
                                       OPTIM_WRAPPERS,
                                       OPTIMIZERS,
                                       RUNNERS,
                                       VISBACKENDS,
                                       )

        cfg = self.cfg
        runner = cfg.get('runner_type', 'Runner')
        if RUNNERS.get(runner) is None:
            self.problem('runner_type', f'unresolved runner {runner!r}')
        half = (cfg.get('model') or {}).get('torch_dtype') in ('bfloat16', 'float16')
        self.rows['runner'] = f'{runner}; {LAUNCH_NOTE}' if half else runner
        self.check_model(cfg.get('model'), MODELS)
        loop = cfg.get('train_cfg') or {}
        loop_cls = self.resolve(LOOPS, loop, 'train_cfg')
        if loop_cls is not None and loop_cls.__name__ != 'RLTrainLoop':
            self.problem('train_cfg', f'type {loop_cls.__name__} is not RLTrainLoop: '
                         'not an RL config of gepo_xtuner')
            return
        self.check_data(cfg.get('train_dataloader') or {}, DATASETS, DATA_SAMPLERS, FUNCTIONS)
        self.check_loop(loop)
        self.check_optim(cfg.get('optim_wrapper') or {}, OPTIM_WRAPPERS, OPTIMIZERS)
        hooks = [self.build(HOOKS, h, f'default_hooks.{k}')
                 for k, h in (cfg.get('default_hooks') or {}).items() if h is not None]
        hooks += [self.build(HOOKS, h, f'custom_hooks[{i}]')
                  for i, h in enumerate(cfg.get('custom_hooks') or [])]
        self.rows['hooks'] = ', '.join(type(h).__name__ for h in hooks if h is not None)
        if cfg.get('log_processor'):
            self.build(LOG_PROCESSORS, cfg.log_processor, 'log_processor')
        for i, backend in enumerate((cfg.get('visualizer') or {}).get('vis_backends', [])):
            self.resolve(VISBACKENDS, backend, f'visualizer.vis_backends[{i}]')
        self.rows['deepspeed'] = ('installed' if importlib.util.find_spec('deepspeed')
                                  else 'not installed here (needed for --deepspeed)')

    def check_model(self, model: dict | None, models) -> None:
        """``model`` through the object the policy builds first
        (:class:`~gepo_xtuner.model.settings.PolicySettings`: the same refusals, the same
        messages), then its directories and whether it loads here."""
        from gepo_xtuner.model.settings import PolicySettings
        cls = self.resolve(models, model, 'model')
        if cls is None:
            return
        settings = None
        if getattr(cls, 'settings_class', None) is PolicySettings:
            try:
                settings = PolicySettings.from_dict(model)
            except (TypeError, ValueError) as exc:
                self.problem('model', exc)
        else:  # another model class: its signature
            self.bind(cls, model, 'model')
        name = self.cfg.get('policy_name')
        self.rows['policy'] = ((f'{name}: ' if name else '')
                               + self.path(model.get('pretrained'), 'model.pretrained', 'model'))
        if model.get('tokenizer'):
            self.rows['tokenizer'] = self.path(model.tokenizer, 'model.tokenizer', 'model')
        self.check_loading(model)
        self.policy_inputs(model)
        self.rows['dtype'] = str(model.get('torch_dtype', 'float32'))
        if settings is not None:
            self.rows['policy loss'] = describe(model.policy_loss, type(settings.build_loss()))

    def check_loading(self, model: dict) -> None:
        """Refuses a policy this environment cannot load (transformers version, the
        checkpoint's own code, class and processor of a vision-language model), from
        the checkpoint's config.json where it is at hand, else the config's
        ``policy_model_type``."""
        import transformers

        from gepo_xtuner.model.families import TEXT_MODEL_CLASS, loading_problems
        config_json = self.config_json
        model_type = (config_json or {}).get('model_type') or self.cfg.get('policy_model_type')
        for problem in loading_problems(model, model_type, config_json):
            self.problem('model', problem)
        parts = [str(model.get('model_class', TEXT_MODEL_CLASS))]
        if model.get('processor'):
            parts.append('processor ' + str(model.processor))
        if model.get('trust_remote_code'):
            parts.append('trust_remote_code')
        self.rows['loading'] = f'{", ".join(parts)} (transformers {transformers.__version__})'

    def check_data(self, loader: dict, datasets, samplers, functions) -> None:
        dataset = loader.get('dataset')
        from gepo_xtuner.data import PromptDataset, PromptMixture

        where = 'train_dataloader.dataset'
        cls = self.resolve(datasets, dataset, where)
        parts = [(dataset, where, cls)]
        if cls is not None and issubclass(cls, PromptMixture):  # each part is a file
            parts = [(part, f'{where}.datasets[{i}]',
                      self.resolve(datasets, part, f'{where}.datasets[{i}]'))
                     for i, part in enumerate(dataset.get('datasets') or [])]
        rows = []
        for part, name, part_cls in parts:
            if part_cls is None:
                continue
            row = self.path(part.get('path'), f'{name}.path', 'file')
            if issubclass(part_cls, PromptDataset):  # its record schema; others have theirs
                row += self.records(part, name)
            rows.append(row)
        if rows:
            self.rows['train data'] = '; '.join(rows)
        if loader.get('sampler'):
            self.resolve(samplers, loader.sampler, 'train_dataloader.sampler')
        if loader.get('collate_fn'):
            self.resolve(functions, loader.collate_fn, 'train_dataloader.collate_fn')

    def check_loop(self, loop: dict) -> None:
        """``train_cfg`` through the object the loop builds first
        (:class:`~gepo_xtuner.engine.train_cfg.TrainCfg`: the same refusals, the same
        messages), then what it names: the processor, the backend, files and rewards.
        A refusal leaves the other parts checked from the raw values."""
        from mmengine.config import ConfigDict

        from gepo_xtuner.engine.step.validation import ValSettings
        from gepo_xtuner.engine.train_cfg import TrainCfg
        from gepo_xtuner.registry import ADVANTAGES, ROLLOUT_BACKENDS
        from gepo_xtuner.reward import RewardRouter

        settings = None
        try:
            settings = TrainCfg.from_dict(loop)
        except (TypeError, ValueError) as exc:
            self.problem('train_cfg', exc)
        raw = ConfigDict({**TrainCfg.defaults(), **loop})
        processor = self.build(ADVANTAGES, raw.get('advantage'), 'train_cfg.advantage')
        if processor is not None:
            self.rows['algorithm'] = describe(raw.advantage, type(processor))
            from gepo_xtuner.engine.step.geometry import check_group_size
            try:  # the loop's own check
                check_group_size(processor, raw.num_responses)
            except ValueError as exc:
                self.problem('train_cfg', str(exc))
        self.rows['K (responses per prompt)'] = str(raw.num_responses)
        if settings is not None:
            params = settings.sampling
            self.rows['sampling'] = (f'temperature {params.temperature}, top_p {params.top_p}, '
                                     f'top_k {params.top_k}, max_new_tokens '
                                     f'{params.max_new_tokens}')
        val = settings.val if settings is not None else None
        if settings is None and raw.get('val'):  # refused elsewhere: still check the files
            try:
                val = ValSettings.from_dict(raw.val)
            except (TypeError, ValueError) as exc:
                if not any(str(exc) in p for p in self.problems):
                    self.problem('train_cfg', exc)
        if val is not None:
            self.check_val(val)
        elif isinstance(raw.get('val'), dict):  # refused: its files are still worth a look
            self.check_val_files(raw.val)
        self.rows['steps'] = str(raw.get('max_steps'))
        rollout = self.build(ROLLOUT_BACKENDS, raw.get('rollout'), 'train_cfg.rollout')
        if rollout is not None:
            self.rows['rollout'] = describe(raw.rollout)
            if settings is not None:
                try:  # the loop's own checks against the built backend
                    settings.check_backend(rollout)
                except ValueError as exc:
                    self.problem('train_cfg', exc)
                k = settings.stage.max_staleness
                if k == 1:
                    self.rows['rollout'] += '; generation one batch ahead (max_staleness 1)'
                elif k >= 2:
                    self.rows['rollout'] += (f'; streaming generation up to {k} batches ahead '
                                             f'(max_staleness {k})')
            rollout.close()
            self.check_sync_address(raw.rollout)
        from gepo_xtuner.registry import REWARDS
        rewards = raw.get('rewards') or {}
        resolved = [self.resolve(REWARDS, fn, f'train_cfg.rewards.{domain}')
                    for domain, fn in rewards.items() if isinstance(fn, dict)]
        if None not in resolved:
            try:
                router = RewardRouter(rewards, route_by=raw.reward_route_by)
                self.rows['rewards'] = ', '.join(f'{domain}: {type(fn).__name__}'
                                                 for domain, fn in router.fns.items())
            except Exception as exc:  # noqa: BLE001 (a misconfigured reward)
                self.problem('train_cfg.rewards', exc)
        self.check_batch(raw, self.cfg.get('optim_wrapper') or {})

    def check_val_files(self, val: dict) -> None:
        """The files a refused ``train_cfg.val`` names, as far as they can be read."""
        entries = [('train_cfg.val.path', val)] if val.get('path') else []
        benchmarks = val.get('benchmarks')
        entries += [(f'train_cfg.val.benchmarks[{i}].path', b)
                    for i, b in enumerate(benchmarks if isinstance(benchmarks, list) else ())
                    if isinstance(b, dict) and b.get('path')]
        for where, entry in entries:
            self.path(entry['path'], where, 'file')

    def check_val(self, val: Any) -> None:
        """The validation files of the checked ``train_cfg.val``, record by record."""
        sets = []
        if val.path is not None:
            read = dict(fields=val.read.fields, default_domain=val.read.default_domain)
            sets.append(self.path(val.path, 'train_cfg.val.path', 'file')
                        + self.records(dict(path=val.path, **read), 'train_cfg.val.path'))
        for i, bench in enumerate(val.benchmarks):
            key = f'train_cfg.val.benchmarks[{i}]'
            how = dict(required=bench.read.required, fields=bench.read.fields,
                       default_domain=bench.read.default_domain)
            where = self.path(bench.path, f'{key}.path', 'file') + self.records(
                dict(path=bench.path, **how), f'{key}.path')
            sets.append(f'{bench.name}: {where}')
        self.rows['validation'] = f'{"; ".join(sets)}, every {val.interval} steps'

    def check_sync_address(self, rollout: dict) -> None:
        """A remote server cannot reach a weight-sync rendezvous on the trainer's loopback."""
        sync = rollout.get('weight_sync') or {}
        url = str(rollout.get('server_url') or '')
        local = ('127.0.0.1', 'localhost')
        if (sync.get('mode') == 'nccl' and sync.get('master_address', '127.0.0.1') in local
                and not any(f'//{host}' in url for host in local)):
            self.warnings.append(
                f'train_cfg.rollout.weight_sync: the server at {url} must reach training rank 0 '
                f"at master_address {sync.get('master_address', '127.0.0.1')!r} for NCCL weight "
                'sync; set MASTER_ADDR to rank 0\'s hostname (tools/slurm_train.sh and '
                'tools/dist_train.sh do)')

    def check_batch(self, loop: dict, optim: dict) -> None:
        from gepo_xtuner.engine.step.geometry import StepGeometry
        try:  # the loop's own check, with the world size this tool was given
            geometry = StepGeometry(
                (self.cfg.get('train_dataloader') or {}).get('batch_size'),
                loop.num_responses, loop.minibatch_responses_per_rank, loop.ppo_epochs,
                self.world_size, loop.prompts_per_step, loop.minibatch_responses)
        except ValueError as exc:
            self.problem('train_cfg', exc)
            return
        self.rows.update(geometry.rows(self.world_source))
        self.warnings.extend(geometry.warnings())
        budget = loop.get('max_tokens_per_micro_batch')
        self.rows['micro batch'] = ('the whole minibatch per forward/backward' if budget is None
                                    else f'<= {budget} padded tokens per forward/backward '
                                         '(gradients accumulated by the loop)')
        if optim.get('accumulative_counts', 1) != 1:
            self.problem('optim_wrapper.accumulative_counts',
                         f'is {optim.get("accumulative_counts")}: the RL loop accumulates '
                         'gradients itself (one optimizer step per minibatch); remove it')

    def check_optim(self, optim: dict, wrappers, optimizers) -> None:
        self.resolve(wrappers, optim, 'optim_wrapper')
        opt = optim.get('optimizer')
        if self.resolve(optimizers, opt, 'optim_wrapper.optimizer') is not None:
            clip = (optim.get('clip_grad') or {}).get('max_norm')
            self.rows['optimizer'] = f'{describe(opt)}, clip_grad max_norm {clip}'


def world_size_of(args_world: int | None) -> tuple[int, str]:
    if args_world is not None:
        return args_world, '--world-size'
    for name, how in (('WORLD_SIZE', 'torchrun'), ('SLURM_NTASKS', 'srun')):
        if os.environ.get(name, '').isdigit() and int(os.environ[name]) > 0:
            return int(os.environ[name]), f'{name}, as {how} sets it'
    return 1, 'WORLD_SIZE and SLURM_NTASKS unset: one process; pass --world-size N'


def check_one(path: Path, options: dict | None, check_paths: bool,
              world: tuple[int, str]) -> dict[str, Any]:
    """Checks one config file; returns its report."""
    from mmengine.config import Config

    report: dict[str, Any] = dict(config=str(path), variables=[], rows={}, problems=[],
                                  warnings=[])
    try:
        variables = config_variables(path.resolve())
    except (OSError, SyntaxError, ValueError) as exc:
        report['problems'].append(f'cannot read: {type(exc).__name__}: {exc}')
        return report
    report['variables'] = [dict(name=v.name, value=v.value, source=v.source,
                                description=v.description) for v in variables]
    unset = [v for v in variables if v.source == 'UNSET']
    if unset:
        for v in unset:
            report['problems'].append(
                f'environment variable {v.name} is not set ({v.description or "no default"}; '
                f'{Path(v.file).name}:{v.line}): export {v.name}=...')
        return report
    try:
        cfg = Config.fromfile(str(path))
        if options:
            cfg.merge_from_dict(options)
    except Exception as exc:  # noqa: BLE001 (the load error is the finding)
        where = f' ({exc.filename}:{exc.lineno})' if isinstance(exc, SyntaxError) else ''
        report['problems'].append(f'cannot load{where}: {type(exc).__name__}: {exc}')
        return report
    checker = Checker(cfg, variables, world, check_paths)
    try:
        checker.run()
    except Exception as exc:  # noqa: BLE001 (a section the checks did not expect)
        checker.problem('config', exc)
    report.update(rows=checker.rows, problems=checker.problems, warnings=checker.warnings)
    return report


def print_report(report: dict[str, Any]) -> None:
    print(f'== {report["config"]}')
    if report['variables']:
        print('  config variables')
        width = max(len(v['name']) for v in report['variables'])
        for v in report['variables']:
            print(f'    {v["name"]:<{width}}  {v["value"] or "-"}  ({v["source"]})'
                  + (f'  {v["description"]}' if v['description'] else ''))
    if report['rows']:
        print('  what would run')
        width = max(len(k) for k in report['rows'])
        for key, value in report['rows'].items():
            print(f'    {key:<{width}}  {value}')
    for warning in report['warnings']:
        print(f'  warning: {warning}')
    for problem in report['problems']:
        print(f'  PROBLEM: {problem}')
    print('  OK' if not report['problems'] else f'  FAILED ({len(report["problems"])} problems)')
    print()


def print_keys(width: int = 100) -> None:
    """Every key the settings objects take, with its default and help (their docstrings)."""
    import textwrap

    from gepo_xtuner.engine.step.validation import ValSettings
    from gepo_xtuner.engine.train_cfg import TrainCfg
    from gepo_xtuner.model.settings import PolicySettings
    from gepo_xtuner.settings import field_defaults

    sections = (('train_cfg', TrainCfg.help(), TrainCfg.defaults()),
                ('train_cfg.val', ValSettings.help(), ValSettings.defaults()),
                ('model', PolicySettings.help(), field_defaults(PolicySettings)))
    for name, helps, defaults in sections:
        print(f'{name}:')
        for key, text in helps.items():
            default = f'= {defaults[key]!r}' if key in defaults else '(required)'
            print(f'  {key} {default}')
            text = re.sub(r':\w+:`~?([\w.]+)`', lambda m: m.group(1).rsplit('.', 1)[-1], text)
            print(textwrap.fill(text.replace('``', '`'), width, initial_indent=' ' * 6,
                                subsequent_indent=' ' * 6))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from mmengine.config import DictAction

    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('configs', nargs='*', type=Path, help='config files')
    parser.add_argument('--keys', action='store_true',
                        help='list every key of train_cfg, train_cfg.val and model with its '
                        'default and help, and exit')
    parser.add_argument('--world-size', type=int, default=None,
                        help='training processes to assume (sets WORLD_SIZE for loading)')
    parser.add_argument('--no-path-check', action='store_true',
                        help='do not check that model and data paths exist')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config keys, as with xtuner train')
    parser.add_argument('--json', action='store_true', help='print the reports as JSON')
    smoke = parser.add_argument_group('smoke mode (N real RL steps on CPU, tiny random model)')
    smoke.add_argument('--smoke-steps', type=int, default=None, metavar='N',
                       help='run N RL steps of the config (one config) and print the last '
                       "step's metrics as JSON")
    smoke.add_argument('--nproc', type=int, default=1, metavar='P',
                       help='training processes of the smoke run (default 1)')
    smoke.add_argument('--work-dir', type=Path, default=None,
                       help='keep the smoke run (model, data, config, logs) here instead of '
                       'a temporary directory')
    smoke.add_argument('--max-new-tokens', type=int, default=12,
                       help='response token limit of the smoke run (default 12)')
    smoke.add_argument('--smoke-cache', type=Path,
                       default=os.environ.get('GEPO_SMOKE_CACHE') or None, metavar='DIR',
                       help='reuse the tiny model and calibrated records of an earlier smoke '
                       'run with the same rewards, K and sampling from DIR, and keep new ones '
                       'there (default: $GEPO_SMOKE_CACHE, else none); checking several '
                       'algorithms of one task mixture prepares them once')
    args = parser.parse_args(argv)
    if not args.configs and not args.keys:
        parser.error('give config files (or --keys)')
    if args.world_size is not None and args.world_size < 1:
        parser.error(f'--world-size must be >= 1, got {args.world_size}')
    if args.smoke_steps is not None:
        if args.smoke_steps < 1 or args.nproc < 1 or args.max_new_tokens < 1:
            parser.error('--smoke-steps, --nproc and --max-new-tokens must be >= 1')
        if len(args.configs) != 1:
            parser.error(f'--smoke-steps runs one config, got {len(args.configs)}')
        if args.world_size is not None:
            parser.error('--world-size does not apply to --smoke-steps; use --nproc')
    return args


def free_port() -> int:
    """A TCP port that was free a moment ago (for torchrun's rendezvous)."""
    import socket
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def smoke(args: argparse.Namespace) -> int:
    """Smoke mode: N real RL steps of one config on CPU (see the module docstring)."""
    import shutil
    import subprocess
    import tempfile
    import time

    from mmengine.config import Config

    from gepo_xtuner.testbed import smoke as sm

    path: Path = args.configs[0]
    if not path.is_file():
        print(f'{path}: no such file', file=sys.stderr)
        return 1
    out = args.work_dir or Path(tempfile.mkdtemp(prefix='gepo-smoke-'))
    out = out.resolve()
    if args.work_dir is not None and (out / 'run').exists():
        shutil.rmtree(out / 'run')  # a re-run must not merge old scalars
    out.mkdir(parents=True, exist_ok=True)
    # Config variables of the paper and tiny configs point at the smoke model and data.
    os.environ.update(GEPO_MODEL_PATH=str(out / 'model'), GEPO_DATA_DIR=str(out / 'data'),
                      GEPO_TINY_DIR=str(out), WORLD_SIZE=str(args.nproc))
    os.environ.pop('SLURM_NTASKS', None)
    start = time.perf_counter()
    try:
        cfg = Config.fromfile(str(path))
        if args.cfg_options:
            cfg.merge_from_dict(args.cfg_options)
        plan = sm.prepare_smoke_run(cfg, out, steps=args.smoke_steps, world_size=args.nproc,
                                    max_new_tokens=args.max_new_tokens,
                                    cache_dir=args.smoke_cache)
    except Exception as exc:  # noqa: BLE001 (report what stops the set-up)
        print(f'{path}: smoke set-up failed: {type(exc).__name__}: {exc}', file=sys.stderr)
        return 1
    g = plan.geometry
    print(f'== smoke run of {path}: {args.smoke_steps} RL steps, {args.nproc} process(es), '
          f'CPU, under {out}')
    print(f'  model family  {plan.family.name} ({plan.family.model_class}): '
          f'{plan.family.reason}')
    for what, (before, after) in plan.replaced.items():
        print(f'  {what:<13} {before} -> {after}')
    print(f'  batch         K={g.num_responses}; {g.prompts_per_rank} prompts per rank x '
          f'{g.world_size} = {g.prompts_per_step} per step (config: '
          f'{g.config["prompts_per_step"]}); minibatch {g.minibatch_responses_per_rank} '
          'responses per rank '
          f'-> {g.minibatches_per_step} optimizer steps per RL step (config: '
          f'{g.config["minibatches_per_step"]})')
    micro = (f'max_tokens_per_micro_batch {g.max_tokens_per_micro_batch} (~{g.micro_batches} '
             f'micro-batches of {g.micro_batch_size} rows x {g.row_tokens} tokens)'
             if plan.interface == 'tokens' else
             f'micro_batch_size {g.micro_batch_size} ({g.micro_batches} per minibatch)')
    print(f'  micro-batches {micro}')
    print('  records       ' + ', '.join(
        f'{d}: reward rate {v["reward_rate"]:.2f}, mixed groups {v["mixed_groups"]:.0%}'
        for d, v in plan.rewards.items()) + f' (tiny policy\'s own samples, seed {plan.seed}'
        + (f'; from the cache {args.smoke_cache})' if plan.cached else ')'))
    cmd = sm.train_command(sys.executable, plan.config_path, plan.run_dir, args.nproc,
                           free_port())
    print(f'  command       {" ".join(cmd)}', flush=True)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get('OMP_NUM_THREADS', '1'),
               PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                       os.environ.get('PYTHONPATH')])))
    env.pop('WORLD_SIZE')  # torchrun sets it per process
    log = out / 'train.log'
    with open(log, 'w', encoding='utf-8') as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, check=False)
    metrics = sm.step_metrics(plan.run_dir)
    steps = sorted(s for s in metrics if s > 0)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0 or steps[-1:] != [args.smoke_steps]:
        tail = log.read_text(encoding='utf-8', errors='replace').splitlines()[-60:]
        print('\n'.join(tail), file=sys.stderr)
        print(f'{path}: smoke run FAILED (exit status {proc.returncode}, steps logged '
              f'{steps}); full log: {log}', file=sys.stderr)
        return 1
    for step in steps:
        row = metrics[step]
        shown = ', '.join(f'{k}={row[k]:.4g}' for k in (
            'reward/mean', 'loss/pg', 'loss/cov_tokens', 'loss/kl_cov_penalty',
            'entropy/policy', 'time/step') if k in row)
        print(f'  step {step}: {shown}')
    print(f'  OK in {elapsed:.1f} s; work dir {out}'
          + ('' if args.work_dir else ' (temporary, removed)'), flush=True)
    if args.work_dir is None:
        shutil.rmtree(out, ignore_errors=True)
    last = {k: (v if not isinstance(v, float) or math.isfinite(v) else None)  # strict JSON
            for k, v in dict(step=steps[-1], **metrics[steps[-1]]).items()}
    print(json.dumps(last, sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from mmengine.logging import MMLogger
    logger = MMLogger.get_instance('check_config', log_level=logging.WARNING)  # quiet INFO
    if args.json:  # stdout holds the JSON alone: log lines (a reward's warning) to stderr
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
                handler.setStream(sys.stderr)
    import gepo_xtuner  # noqa: F401  (registers what the configs name)

    if args.keys:
        print_keys()
        return 0
    if args.smoke_steps is not None:
        return smoke(args)

    if args.world_size is not None:
        os.environ['WORLD_SIZE'] = str(args.world_size)
    world = world_size_of(args.world_size)
    reports = []
    for path in args.configs:
        if not path.is_file():
            reports.append(dict(config=str(path), variables=[], rows={}, warnings=[],
                                problems=['no such file']))
            continue
        reports.append(check_one(path, args.cfg_options, not args.no_path_check, world))
    if args.json:
        print(json.dumps(reports, indent=1))
    else:
        for report in reports:
            print_report(report)
    failed = [r['config'] for r in reports if r['problems']]
    for report in reports:
        for problem in report['problems']:
            print(f'{report["config"]}: {problem}', file=sys.stderr)
    if failed:
        print(f'{len(failed)} of {len(reports)} configs FAILED: {", ".join(failed)}',
              file=sys.stderr)
        return 1
    print(f'all {len(reports)} configs OK', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
