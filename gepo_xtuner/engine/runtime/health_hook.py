"""Watches a run's per-step metrics and raises named alarms early (length collapse, ...)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from mmengine.dist import all_reduce
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

from ...analysis.health import CHECKS, Finding, build_checks, next_active
from ..state.resume import resumed_entry
from .mmengine_private import save_checkpoint_now

#: The checkpoint key of the hook's state.
KEY = 'gepo_xtuner/run_health'
#: The training program's exit status after ``action='stop'``.
STOP_EXIT_STATUS = 3


@HOOKS.register_module()
class RunHealthHook(Hook):
    """Raises named alarms from the loop's per-step metrics; warns or stops the run.

    After every RL step the hook hands the step's metrics (the row the loop appends to
    its history, validation included) to the checks of :mod:`gepo_xtuner.analysis.health`.
    An alarm that starts to hold prints one warning line (step, alarm, domain, figures,
    what to try); while it holds (a domain absent from a step's batch keeps its alarms,
    see :func:`~gepo_xtuner.analysis.health.next_active`), ``health/<alarm>`` counts the
    domains in alarm and ``health/<alarm>/<domain>`` is 1 (0 otherwise; every step, in the scalar
    backends and in the run's history, so ``training_curves.png`` marks where alarms
    fired). At the end of the run a summary lists every alarm raised.

    With ``action='stop'``, the first alarm saves a checkpoint of the step (through the
    run's ``CheckpointHook``, so ``--resume`` continues from it), ends the loop after
    that step (``train_loop.stop_training``, mmengine's convention), and the training
    program exits with status 3 (:data:`STOP_EXIT_STATUS`) once the end-of-run hooks
    have run. Ranks decide together (an all-reduce of the stop flag).

    The state (each check's windows, start levels and counters, the alarms raised) is
    checkpointed under ``'gepo_xtuner/run_health'``, so a resumed run raises the alarms
    an uninterrupted one would.

    Args:
        action: ``'warn'`` (default) or ``'stop'``.
        checks: per check name (``length_collapse``, ``entropy``, ``gepo``,
            ``rollout_mismatch``, ``clip``, ``reward_without_val``), the arguments that
            differ from its defaults, or ``None`` to switch it off, e.g.
            ``dict(length_collapse=dict(drop=0.3), clip=None)``.
    """

    priority = 'NORMAL'  # after RuntimeInfoHook, before LoggerHook logs the step

    def __init__(self, action: str = 'warn',
                 checks: Mapping[str, Mapping[str, Any] | None] | None = None) -> None:
        if action not in ('warn', 'stop'):
            raise ValueError(f"RunHealthHook action must be 'warn' or 'stop', got {action!r}")
        self.action = action
        self.checks = build_checks(checks or {})
        self.alarm_names = [a for c in self.checks.values() for a in c.alarms]
        self.active: set[tuple[str, str]] = set()
        self.events: list[dict[str, Any]] = []  # every alarm raised: step, alarm, domain, message
        self.last_step = -1  # the last history row fed to the checks
        self.exit_status: int | None = None  # set when this hook stopped the run

    # -- state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return dict(checks={n: c.state_dict() for n, c in self.checks.items()},
                    active=sorted(self.active), events=list(self.events),
                    last_step=self.last_step)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, check in self.checks.items():
            check.load_state_dict(state.get('checks', {}).get(name, {}))
        self.active = {tuple(a) for a in state.get('active', [])}
        self.events = list(state.get('events', []))
        self.last_step = int(state.get('last_step', -1))

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint[KEY] = self.state_dict()

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        state = resumed_entry(runner, checkpoint, KEY, 'run-health checks start afresh '
                              '(start levels and peaks are those of the resumed part)')
        if state is not None:
            self.load_state_dict(state)

    # -- the step ---------------------------------------------------------------------
    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs: dict | None = None) -> None:
        history = getattr(runner.train_loop, 'history', None)
        if not history:
            return
        new: list[tuple[int, Finding]] = []
        for row in history:  # the validation before training (step 0) too
            step = int(row['step'])
            if step <= self.last_step:
                continue
            self.last_step = step
            findings = [f for check in self.checks.values() for f in check.observe(step, row)]
            self.active, started = next_active(self.active, findings, row)
            new += [(step, f) for f in started]
        for step, finding in new:
            self.events.append(dict(step=step, alarm=finding.alarm, domain=finding.domain,
                                    message=finding.message))
            print_log(f'health: step {step}: {finding.alarm} [{finding.domain}]: '
                      f'{finding.message}', logger='current', level=logging.WARNING)
        metrics = self.step_metrics(self.active)
        if outputs is not None:
            outputs.update(metrics)  # the step's metrics (the log line's filter reads them)
        history[-1].update(metrics)  # the run's history: figure, summarize_run.py, resume
        for key, value in metrics.items():
            runner.message_hub.update_scalar(f'train/{key}', value)
        stop = torch.tensor([float(self.action == 'stop' and bool(new))])
        all_reduce(stop, op='max')
        if stop.item() > 0:
            self._stop(runner)

    def step_metrics(self, active: set[tuple[str, str]]) -> dict[str, float]:
        """``health/<alarm>`` (domains in alarm) and ``health/<alarm>/<domain>`` (1)."""
        metrics = {f'health/{a}': 0.0 for a in self.alarm_names}
        for alarm, domain in active:
            metrics[f'health/{alarm}'] += 1.0
            metrics[f'health/{alarm}/{domain}'] = 1.0
        return metrics

    def _stop(self, runner) -> None:
        prepare = getattr(runner.train_loop, 'prepare_checkpoint', None)
        if prepare is not None:  # every rank: e.g. the batches generated ahead
            prepare()
        where = save_checkpoint_now(runner)  # the CheckpointHook's names and bookkeeping
        print_log(f"health: action='stop': stopping after step {runner.iter + 1}; checkpoint "
                  f'{where} (continue with --resume {where} after fixing the cause, or with '
                  "default_hooks.health.action='warn')", logger='current', level=logging.ERROR)
        runner.train_loop.stop_training = True
        self.exit_status = STOP_EXIT_STATUS
        # the exit comes last, after every end-of-run hook (figure, export, servers closed)
        runner.register_hook(_ExitAfterRun(STOP_EXIT_STATUS), priority='LOWEST')

    # -- the end ----------------------------------------------------------------------
    def after_train(self, runner) -> None:
        runner.logger.info(self.summary())

    def summary(self) -> str:
        """One line per alarm raised, or that none was."""
        if not self.events:
            return (f'Run health: no alarm ({len(self.checks)} checks: '
                    f'{", ".join(self.checks)})')
        lines = [f'Run health: {len(self.events)} alarm(s) raised:']
        lines += [f'  step {e["step"]}: {e["alarm"]} [{e["domain"]}]: {e["message"]}'
                  for e in self.events]
        return '\n'.join(lines)


class _ExitAfterRun(Hook):
    """Ends the training program with ``status`` after all other ``after_run`` hooks."""

    def __init__(self, status: int) -> None:
        self.status = status

    def after_run(self, runner) -> None:
        raise SystemExit(self.status)


__all__ = ['RunHealthHook', 'KEY', 'STOP_EXIT_STATUS', 'CHECKS']
