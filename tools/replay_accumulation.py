#!/usr/bin/env python
"""Replay where optimizer steps happen, and by what each loss is divided, at the paper geometry.

Usage::

    python tools/replay_accumulation.py [--micro 64] [--minibatches 8] [--steps 300]
        [--resume-at 150]

Compares two ways of training M micro-batches per minibatch, ``--minibatches``
minibatches per RL step, for ``--steps`` RL steps, with mmengine's real
``OptimWrapper`` on a one-parameter model:

- ``wrapper``: the loop calls ``optim_wrapper.update_params(loss)`` once per
  micro-batch and lets the wrapper accumulate (``accumulative_counts=M``), with
  the counters the Runner initialises in RL steps
  (``initialize_count_status(model, start_step, max_steps)``);
- ``explicit``: ``gepo_xtuner.engine.step.optim_step.optimizer_step`` (one step per
  minibatch, nothing divided by a count).

Each micro-batch holds 1/M of its minibatch's loss, written as the loop writes it:
``M * w / M`` for the wrapper (the old loop passed the minibatch token count / M
as the denominator and let the wrapper divide by M), ``w / M`` for the explicit
step. The ideal gradient at every optimizer step is exactly 1 (one whole
minibatch). Prints, for each way: optimizer steps, steps that do not end a
minibatch, and the steps whose gradient is not 1 (with their values).
"""

import argparse
from collections import Counter

import torch
from mmengine.optim import OptimWrapper
from torch import nn


class Probe(nn.Module):
    """One parameter; the loss is ``scale * w``, so its gradient is ``scale``."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))
        self.scale = scale
        self.data_preprocessor = lambda data, training=False: data

    def forward(self, inputs=None, mode='loss'):
        return {'loss': self.w * self.scale}

    @staticmethod
    def parse_losses(losses):
        return losses['loss'], {'loss': losses['loss'].detach()}


class Recorder(torch.optim.SGD):
    """SGD that records the accumulated gradient at each step (then zeroes the parameter)."""

    def __init__(self, params) -> None:
        super().__init__(params, lr=0.0)
        self.grads: list[float] = []

    def step(self, closure=None):  # noqa: D102
        self.grads.append(float(self.param_groups[0]['params'][0].grad))
        return super().step(closure)


def replay_wrapper(micro: int, minibatches: int, steps: int, resume_at: int | None) -> dict:
    model = Probe(scale=1.0)  # M x (1/M): the wrapper is expected to divide by M
    opt = Recorder(model.parameters())
    wrapper = OptimWrapper(opt, accumulative_counts=micro)
    calls = 0
    ends: list[bool] = []
    starts = [0] if resume_at is None else [0, resume_at]
    for run, start in enumerate(starts):
        stop = steps if run == len(starts) - 1 else resume_at
        wrapper.initialize_count_status(model, start, steps)  # as Runner.train() does
        for _ in range(start, stop):
            for _ in range(minibatches):
                for j in range(micro):
                    before = len(opt.grads)
                    with wrapper.optim_context(model):
                        loss = model()['loss']
                    wrapper.update_params(loss)
                    calls += 1
                    if len(opt.grads) > before:
                        ends.append(j == micro - 1)
    return dict(grads=opt.grads, ends=ends, calls=calls)


def replay_explicit(micro: int, minibatches: int, steps: int) -> dict:
    from gepo_xtuner.engine.step.optim_step import optimizer_step
    model = Probe(scale=1.0 / micro)  # normalised by the whole minibatch
    opt = Recorder(model.parameters())
    wrapper = OptimWrapper(opt)
    for _ in range(steps * minibatches):
        optimizer_step(model, wrapper, [dict()] * micro)
    return dict(grads=opt.grads, ends=[True] * len(opt.grads), calls=steps * minibatches * micro)


def report(name: str, out: dict, micro: int, minibatches: int, steps: int) -> None:
    grads, ends = out['grads'], out['ends']
    wrong = Counter(round(g, 6) for g in grads if abs(g - 1.0) > 1e-6)
    print(f'{name:9s} optimizer steps {len(grads):5d} (expected {steps * minibatches}), '
          f'mid-minibatch steps {ends.count(False):4d}, steps with gradient != 1: '
          f'{sum(wrong.values()):4d} {dict(sorted(wrong.items())[:4])}')


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--micro', type=int, default=64, help='micro-batches per minibatch')
    parser.add_argument('--minibatches', type=int, default=8, help='minibatches per RL step')
    parser.add_argument('--steps', type=int, default=300, help='RL steps (max_steps)')
    parser.add_argument('--resume-at', type=int, default=None,
                        help='also replay a --resume at this RL step (wrapper only)')
    args = parser.parse_args(argv)
    print(f'{args.micro} micro-batches x {args.minibatches} minibatches x {args.steps} steps')
    report('wrapper', replay_wrapper(args.micro, args.minibatches, args.steps, None), args.micro,
           args.minibatches, args.steps)
    if args.resume_at is not None:
        report('resumed', replay_wrapper(args.micro, args.minibatches, args.steps,
                                         args.resume_at), args.micro, args.minibatches,
               args.steps)
    report('explicit', replay_explicit(args.micro, args.minibatches, args.steps), args.micro,
           args.minibatches, args.steps)


if __name__ == '__main__':
    main()
