"""The check that a weight push reached the engine: a fixed probe sequence, scored twice.

After every push, each server that took the weights scores a fixed 16-token probe
sequence (one short request; the engine's own way to return the logprobs of given
tokens), and rank 0 scores the same sequence with the trainer's model. Two things are
checked (:func:`judge`):

* **the gap**: ``max_t |server_t - trainer_t|`` must be within ``probe_tolerance``. This
  catches a server that runs other weights than the trainer's (a partial reload, another
  checkpoint). The default, :data:`DEFAULT_TOLERANCE`, has to let a correct push pass
  whatever the server's dtype: float32 on both sides differs by 5e-5 at most (the CPU
  tests), a bf16 server from a float32 trainer by up to 0.48 nats per token on the GPU
  (``docs/gpu.md``: a server started on the very weights it was compared with), so 1.0.
* **the move**: a push that was skipped leaves the engine's answer exactly what it was
  after the previous push it took, while the trainer's logprobs moved. A dtype's
  rounding shifts the gap but not this: an engine that loaded new weights answers
  differently (a bf16 engine too: any rounding that flips changes a logit somewhere in
  the vocabulary), one that ignored them answers the same numbers. So a server whose
  answer did not change (within :data:`SAME`) while the trainer's moved by more than
  :data:`MOVE_FLOOR` failed the push, whatever the tolerance. This is what catches a
  skipped push at the first step, where the trainer's logprobs move by 1e-4 to 1e-2 and
  the gap alone cannot tell that from bf16 rounding. A push of identical weights moves
  neither and passes; a step that moved the trainer by less than the floor keeps the
  comparison on the older answer, so moves add up until they show.

Why the floor is 1e-3: below it a bf16 engine that did load the weights might, on a
tiny vocabulary, give bit-identical logprobs (a logit's bf16 step is about 0.03 at the
probe's magnitudes), which must not stop a run. Above it every logit of the probe
positions would have to stay on its bf16 value, which does not happen.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

#: the default ``weight_sync.probe_tolerance`` (largest per-token gap, nats; see module doc)
DEFAULT_TOLERANCE = 1.0
#: the trainer's move (nats, largest per token) above which the server's answer must change
MOVE_FLOOR = 1e-3
#: how close two answers of a server are to count as the same (float round trips)
SAME = 1e-7
#: tokens in the probe sequence
PROBE_LEN = 16


@dataclass
class ProbeRecord:
    """What a server answered after the last push it was seen to take.

    Attributes:
        trainer: the trainer's logprobs of the probe for the weights of that push.
        server: the server's answer then.
        version: the push's weight version.
    """

    trainer: list[float]
    server: list[float]
    version: int


def probe_ids(vocab_size: int | None) -> list[int]:
    """The probe sequence: a fixed stride through the vocabulary's first ids (ordinary
    tokens in every tokenizer seen; no model gives them a probability near 1, so their
    logprobs move with the weights instead of sitting at 0)."""
    vocab = int(vocab_size or 32)
    return [(7 * i + 3) % vocab for i in range(PROBE_LEN)]


def trainer_logprobs(model: nn.Module, ids: Sequence[int]) -> list[float]:
    """``log p(ids[t] | ids[:t])``, ``t >= 1``, under ``model``'s weights (one forward
    pass, in eval mode and without gradients; the training mode is restored)."""
    device = next(model.parameters()).device
    tokens = torch.tensor([list(ids)], device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=tokens).logits[0, :-1].float()
    finally:
        model.train(was_training)
    return torch.log_softmax(logits, -1).gather(-1, tokens[0, 1:, None])[:, 0].tolist()


def vocab_size(model: nn.Module) -> int | None:
    """The model's vocabulary size from its config (``None`` when it has none)."""
    return getattr(getattr(model, 'config', None), 'vocab_size', None)


def check_probe_setting(cfg: dict) -> None:
    """Checks ``weight_sync.probe_tolerance``: a positive number or ``None`` (off), and
    not given with mode ``'none'`` (nothing is pushed, so there is nothing to check).

    Raises:
        ValueError: what is wrong and what to write instead.
    """
    if 'probe_tolerance' not in cfg:
        return
    tol = cfg['probe_tolerance']
    if cfg.get('mode') == 'none':
        raise ValueError(
            f"weight_sync mode 'none' pushes no weights, so probe_tolerance={tol!r} would check "
            'nothing; drop probe_tolerance, or use a mode that pushes (the probe runs after '
            'every push)')
    if tol is not None and not (isinstance(tol, int | float) and not isinstance(tol, bool)
                                and math.isfinite(tol) and tol > 0):
        raise ValueError(f'weight_sync.probe_tolerance must be a positive number, or None to '
                         f'switch the check off; got {tol!r}')


def max_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def judge(got: Sequence[float], expected: Sequence[float], last: ProbeRecord | None,
          tolerance: float, version: int) -> tuple[str | None, float, ProbeRecord | None]:
    """The verdict on one server's probe answer after push ``version``.

    Args:
        got: the server's answer now.
        expected: the trainer's logprobs for the weights pushed.
        last: the server's record from the last push it took (``None``: unknown).
        tolerance: the largest gap allowed.

    Returns:
        ``(why, gap, record)``: why the push failed (``None``: it passed), the largest
        gap to the trainer, and the record to keep for the next push (``last`` itself
        while neither side moved enough to tell).
    """
    gap = max_abs_diff(got, expected)
    if len(got) != len(expected):
        return (f'its probe answer has {len(got)} logprobs for {len(expected)} probe tokens',
                gap, None)
    if not gap <= tolerance:  # also NaN
        why = (f"its logprobs of the probe differ from the trainer's by up to {gap:.3g} "
               f'(weight_sync.probe_tolerance={tolerance:g})')
        if last is not None:
            why += (f"; from the trainer's of weight version {last.version} by "
                    f'{max_abs_diff(got, last.trainer):.3g}')
        return why + ": the server does not run the weights pushed", gap, None
    if last is None:
        return None, gap, ProbeRecord(list(expected), list(got), version)
    moved = max_abs_diff(expected, last.trainer)
    changed = max_abs_diff(got, last.server)
    if changed <= SAME and moved > MOVE_FLOOR:
        return (f'its logprobs of the probe are the ones it gave for weight version '
                f"{last.version} (changed by {changed:.1g}) while the trainer's moved by up to "
                f'{moved:.3g} (gap {gap:.3g}): the reload did not reach the engine', gap, None)
    if changed <= SAME:
        return None, gap, last
    return None, gap, ProbeRecord(list(expected), list(got), version)


__all__ = ['DEFAULT_TOLERANCE', 'MOVE_FLOOR', 'PROBE_LEN', 'ProbeRecord', 'SAME',
           'check_probe_setting', 'judge', 'max_abs_diff', 'probe_ids', 'trainer_logprobs',
           'vocab_size']
