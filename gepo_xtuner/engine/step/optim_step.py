"""One optimizer step over several micro-batches, with the accumulation in plain sight.

mmengine's ``OptimWrapper.update_params`` decides by its own iteration counters
when to step and by what to divide the loss; the Runner initialises those
counters in RL steps, not micro-batches, so they drift out of line with
minibatches (and after ``--resume``). The RL loop therefore never lets the wrapper
count: for each minibatch it calls :func:`optimizer_step`, which runs

    zero_grad
    for each micro-batch: forward (no gradient sync except on the last) + backward
    step (gradient clipping, optimizer)

The losses are normalised by the caller (by the whole minibatch's token count
over all ranks), so nothing here divides by a number of micro-batches.
"""

from collections.abc import Callable, Sequence
from contextlib import ExitStack, nullcontext
from typing import Any

import torch
from mmengine.model import is_model_wrapper
from torch import Tensor

from ...ops.distributed import all_reduce

__all__ = ['check_accumulation', 'is_deepspeed', 'lockstep_micro_batches', 'optimizer_step',
           'prime_gradient_buckets', 'reduces_every_backward']


def is_deepspeed(optim_wrapper: Any) -> bool:
    """Whether ``optim_wrapper`` is mmengine's ``DeepSpeedOptimWrapper`` (``--deepspeed``)."""
    return type(optim_wrapper).__name__ == 'DeepSpeedOptimWrapper'


def reduces_every_backward(optim_wrapper: Any) -> bool:
    """Whether gradients are reduced across ranks at every backward, not once per step.

    DeepSpeed ZeRO-2/3 reduce-scatter each micro-batch's gradients into the
    partitions as they are produced, so every rank must run the same number of
    micro-batches; DDP (``no_sync`` until the last) reduces once per step.
    """
    return is_deepspeed(optim_wrapper)


def check_accumulation(optim_wrapper: Any) -> None:
    """Refuses an optimizer wrapper that would accumulate gradients by itself.

    Accepts the built wrapper or its config dict (the Runner builds the loop
    before the wrapper).

    Raises:
        ValueError: when ``accumulative_counts`` is not 1, saying what to set.
    """
    if isinstance(optim_wrapper, dict):
        counts = optim_wrapper.get('accumulative_counts', 1)
    else:
        counts = getattr(optim_wrapper, '_accumulative_counts', 1)
    if counts != 1:
        raise ValueError(
            f'optim_wrapper.accumulative_counts is {counts}: RLTrainLoop accumulates gradients '
            'itself, one optimizer step per minibatch over micro-batches formed by '
            'train_cfg.max_tokens_per_micro_batch; remove accumulative_counts from '
            'optim_wrapper (or set it to 1)')


def _sync_context(model: torch.nn.Module, sync: bool) -> Any:
    """DDP's ``no_sync`` on all but the last micro-batch: one gradient all-reduce per step."""
    if not sync and hasattr(model, 'no_sync'):
        return model.no_sync()
    return nullcontext()


def optimizer_step(model: torch.nn.Module, optim_wrapper: Any, micro_inputs: Sequence[Any],
                   loss_scale: float = 1.0, pad: Callable[[], Any] | None = None
                   ) -> tuple[list[dict[str, Tensor]], float | None]:
    """Accumulates the gradients of ``micro_inputs``, then takes one optimizer step.

    Args:
        model: the (possibly DDP-wrapped) :class:`~gepo_xtuner.model.RLPolicy`.
        optim_wrapper: mmengine ``OptimWrapper`` / ``AmpOptimWrapper`` built with
            ``accumulative_counts=1`` (see :func:`check_accumulation`), or a
            ``DeepSpeedOptimWrapper``.
        micro_inputs: the inputs of each micro-batch (``RLPolicy.forward``'s loss mode,
            :class:`~gepo_xtuner.model.inputs.LossInputs`). Every micro-batch's loss must
            already be normalised by the whole minibatch.
        loss_scale: multiplies every loss before backward. Data-parallel wrappers
            AVERAGE gradients over ranks; the loop passes the world size so that
            the result is the gradient of the global sum.
        pad: makes a micro-batch of loss 0 (no valid token). With it, the ranks are kept
            in lockstep (:func:`lockstep_micro_batches`): a rank with no micro-batch runs
            one, so that the gradient all-reduce of data-parallel training meets on every
            rank, and where every backward reduces (DeepSpeed ZeRO) every rank runs as
            many as the rank with the most (a collective then). Without it, at least one
            micro-batch is required.

    Returns:
        ``(log_vars, grad_norm)``: each micro-batch's detached outputs
        (``RLPolicy.parse_losses``; padding ones last) and the gradient norm before clipping if the
        wrapper clips (else None).
    """
    if pad is not None:
        micro_inputs = lockstep_micro_batches(list(micro_inputs), optim_wrapper, pad)
    if not micro_inputs:
        raise ValueError('optimizer_step needs at least one micro-batch')
    policy = model.module if is_model_wrapper(model) else model
    deepspeed = is_deepspeed(optim_wrapper)
    # mmengine's DeepSpeed wrapper is not callable; its DeepSpeedEngine (``.model``) is.
    forward = model.model if deepspeed else model
    if not deepspeed:  # DeepSpeed zeroes its (partitioned) gradients after each step itself
        optim_wrapper.zero_grad()
    logs = []
    for j, inputs in enumerate(micro_inputs):
        last = j == len(micro_inputs) - 1
        data = policy.data_preprocessor(dict(inputs=inputs), training=True)
        with ExitStack() as stack:
            if not deepspeed:  # DeepSpeed casts and syncs in its engine
                stack.enter_context(_sync_context(model, sync=last))
                stack.enter_context(optim_wrapper.optim_context(model))
            losses = forward(**data, mode='loss')
            loss, log_vars = policy.parse_losses(losses)
            if deepspeed:
                # DeepSpeed reduces at the boundary we name; with gradient_accumulation_steps
                # 1 (accumulative_counts 1) its backward does not rescale the loss.
                optim_wrapper.model.set_gradient_accumulation_boundary(last)
                optim_wrapper.backward(loss * loss_scale)
                with torch.no_grad():  # DeepSpeed 0.18's ZeRO all-gather fails under autograd (gloo)
                    optim_wrapper.step()  # steps only at the boundary
            else:
                optim_wrapper.backward(loss * loss_scale)
        logs.append(log_vars)
    if deepspeed:
        return logs, None
    optim_wrapper.step()  # clips (and records the norm) if clip_grad is configured
    optim_wrapper.zero_grad()
    hub = optim_wrapper.message_hub
    if getattr(optim_wrapper, 'clip_grad_kwargs', None) and 'train/grad_norm' in hub.log_scalars:
        return logs, float(hub.get_scalar('train/grad_norm').current())
    return logs, None


def lockstep_micro_batches(micro_inputs: list[Any], optim_wrapper: Any,
                           pad: Callable[[], Any]) -> list[Any]:
    """``micro_inputs`` padded with ``pad()`` micro-batches (loss 0) so that every rank takes
    part in every gradient reduction: at least one micro-batch (DDP reduces once, at the
    last), or, where every backward reduces (:func:`reduces_every_backward`), as many as
    the rank with the most (one all-reduce)."""
    want = max(len(micro_inputs), 1)
    if reduces_every_backward(optim_wrapper):
        want = int(all_reduce(torch.tensor([want]), op='max'))
    return micro_inputs + [pad() for _ in range(want - len(micro_inputs))]


def prime_gradient_buckets(model: torch.nn.Module, optim_wrapper: Any, inputs: dict) -> bool:
    """After ``--resume``, gives DDP the gradient buckets the uninterrupted run has.

    DDP reduces the first backward after it is built in one bucket of all parameters
    (in reverse definition order) and then rebuilds its buckets in the order the
    gradients became ready. The position of a gradient element in its bucket decides
    the order in which a ring all-reduce adds the ranks' values, which with three or
    more ranks changes the float sum in its last bits. A run resumed at step k would
    reduce step k+1's first minibatch in the initial layout while the uninterrupted
    run uses the rebuilt one. This runs ``inputs`` (a micro-batch whose loss is 0:
    no valid token) forward and backward once, on its own random streams, and clears
    the gradients: the buckets are rebuilt at the next forward, as after step 1 of
    the uninterrupted run, and nothing else changes.

    Args:
        model: the DDP-wrapped policy (anything else: nothing is done).
        optim_wrapper: the run's optimizer wrapper (its gradients are cleared).
        inputs: ``RLPolicy`` loss-mode inputs of one micro-batch, all-zero response mask
            (:meth:`~gepo_xtuner.model.inputs.LossInputs.without_tokens`).

    Returns:
        Whether a pass ran (a collective: every rank must call it at the same point).
    """
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return False
    policy = model.module
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        optim_wrapper.zero_grad()
        data = policy.data_preprocessor(dict(inputs=inputs), training=True)
        with optim_wrapper.optim_context(model):
            loss, _ = policy.parse_losses(model(**data, mode='loss'))
        loss.backward()
        optim_wrapper.zero_grad()
    return True
