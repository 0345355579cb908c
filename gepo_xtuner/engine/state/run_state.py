"""Per-rank random state and run settings of the RL loop's checkpoints.

Every data-parallel rank draws from its own random streams (sampling, minibatch
shuffles, a policy loss's generator), and ranks consume different numbers of draws
(responses of different lengths, different kept rows), so the streams part after the
first step. A checkpoint therefore holds one entry per rank, gathered to rank 0 at
the end of every step (:func:`gather_rank_states`: one ``all_gather_object`` of a
few kilobytes per rank; a batch generated ahead, much larger, only at checkpoint
steps: ``RLTrainLoop.prepare_checkpoint``) and written with the rest of the
checkpoint, in the same atomic file (mmengine) or the same client state (DeepSpeed).
On ``--resume`` rank ``r`` restores entry ``r`` (:func:`rank_entry`).

The run settings that give a step its meaning (:func:`run_settings`) are saved too,
and a resume under other settings says what changed and what it means
(:func:`describe_changes`).
"""

import hashlib
import logging
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from mmengine.logging import print_log

from ...ops.distributed import dist_rank, dist_world_size

if TYPE_CHECKING:  # the settings module imports the step's modules; only a hint here
    from ..train_cfg import TrainCfg

__all__ = ['capture_rng', 'describe_changes', 'gather_rank_states',
           'gather_to_first', 'isolated_rng', 'rank_entry', 'restore_processor_state',
           'restore_rng', 'resume_streams', 'run_settings', 'saved_rank_entry', 'seed_streams']


def capture_rng() -> dict[str, Any]:
    """The torch (and CUDA), NumPy and Python RNG states of this process."""
    rng: dict[str, Any] = dict(torch=torch.get_rng_state(), numpy=np.random.get_state(),
                               python=random.getstate())
    if torch.cuda.is_available():
        rng['cuda'] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    """Sets the RNG states :func:`capture_rng` returned."""
    torch.set_rng_state(rng['torch'])
    np.random.set_state(rng['numpy'])
    random.setstate(rng['python'])
    if 'cuda' in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng['cuda'])


def seed_streams(seed: int | None, rank: int, step: int) -> None:
    """Seeds torch (and CUDA), NumPy and Python from ``(seed, rank, step)``: distinct,
    reproducible streams for a rank that has no saved state of its own."""
    digest = hashlib.sha256(f'{seed or 0}/{rank}/{step}'.encode()).digest()
    value = int.from_bytes(digest[:8], 'little') % 2**32
    torch.manual_seed(value)  # also every CUDA device
    np.random.seed(value)
    random.seed(value)


def gather_rank_states(mine: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``mine``, in rank order (a one-element list in one process).

    A collective: every rank must call it at the same point.
    """
    world = dist_world_size()
    if world == 1:
        return [mine]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, mine)
    return out


def gather_to_first(mine: Any) -> list[Any] | None:
    """Every rank's ``mine`` on rank 0, in rank order (None on the other ranks).

    A collective: every rank must call it at the same point. For what only the
    checkpoint's writer needs (rank 0 under mmengine's Runner and DeepSpeed).
    """
    world = dist_world_size()
    if world == 1:
        return [mine]
    out: list[Any] | None = [None] * world if dist_rank() == 0 else None
    dist.gather_object(mine, out, dst=0)
    return out


def rank_entry(ranks: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, str | None]:
    """This rank's saved entry of ``ranks``, and a warning when the world size changed.

    A checkpoint of P ranks resumed on P' != P ranks is explained, not refused: the
    model and optimizer do not depend on the world size under DDP, and continuing a
    long run on fewer or more machines can be what is wanted. Ranks below P continue
    their own streams; a rank with no saved entry gets streams seeded from
    ``(seed, rank, step)`` (``None`` is returned for it; see :func:`seed_streams`).

    Returns:
        ``(entry or None, warning or None)``.
    """
    rank, world = dist_rank(), dist_world_size()
    entry = ranks[rank] if rank < len(ranks) else None
    if len(ranks) == world:
        return entry, None
    return entry, (
        f'the checkpoint was written by {len(ranks)} training processes, this run has '
        f'{world}: the run continues but cannot repeat the uninterrupted one. Each rank '
        'draws its own share of the prompts, so the shares change (the data position '
        'replayed on resume is that of the new world size: some prompts of the current '
        'epoch are seen twice, others not at all), and the global batch, the optimizer '
        'steps\' batch and the batch statistics of the advantage (e.g. GEPO\'s band) '
        f'change in proportion. Ranks 0..{min(len(ranks), world) - 1} continue their saved '
        'random streams; '
        + ('ranks without a saved state start streams seeded from (seed, rank, step).'
           if world > len(ranks) else
           f'the streams of ranks {world}..{len(ranks) - 1} are dropped.'))


def run_settings(cfg: 'TrainCfg', prompts_per_rank: Any, world_size: int) -> dict[str, Any]:
    """The settings a checkpoint's steps were taken under (plain values, comparable).

    Args:
        cfg: the run's :class:`~gepo_xtuner.engine.train_cfg.TrainCfg`.
        prompts_per_rank: the dataloader's batch size (None: sizes vary).
        world_size: training processes.
    """
    return dict(num_responses=cfg.num_responses, prompts_per_rank=prompts_per_rank,
                minibatch_responses_per_rank=cfg.update.minibatch_responses_per_rank,
                ppo_epochs=cfg.update.ppo_epochs, world_size=world_size,
                max_steps=cfg.max_steps, advantage=_plain(cfg.advantage),
                kept_rows=cfg.update.kept_rows, max_staleness=cfg.stage.max_staleness)


def _plain(value: Any) -> Any:
    """A config as plain dicts, lists and scalars (mmengine ``ConfigDict`` included)."""
    if hasattr(value, 'to_dict'):
        value = value.to_dict()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)


#: What a change of each setting means for the resumed run.
MEANINGS = {
    'num_responses': (
        'groups now hold {new} responses instead of {old}: group-relative advantages and '
        'group entropies change scale, and a saved advantage state (GEPO\'s entropy band, '
        'an EMA of batch statistics over groups of {old}) describes the old groups until '
        'it adapts'),
    'prompts_per_rank': (
        'each rank now draws {new} prompts per step instead of {old}: the global batch '
        'changes, and the data position replayed on resume (steps x the new batch) is not '
        'where the checkpoint stopped, so prompts of the current epoch are repeated or '
        'skipped'),
    'world_size': (
        '{new} training processes instead of {old}: the global batch changes in proportion '
        'and the ranks\' prompt shares differ'),
    'minibatch_responses_per_rank': (
        'optimizer steps now take {new} responses per rank instead of {old}: a different '
        'number of optimizer steps per RL step'),
    'ppo_epochs': (
        '{new} passes over each rollout batch instead of {old}: a different number of '
        'optimizer steps per RL step'),
    'advantage': (
        'the advantage processor\'s settings changed; its saved state (if any) continues '
        'under the new settings'),
    'kept_rows': (
        'rows a processor removes are now trained as {new!r} instead of {old!r}: a '
        'different number of optimizer steps on steps that remove rows'),
    'max_staleness': (
        'generation now runs {new} batch(es) ahead instead of {old}: with 1, the batch the '
        'checkpoint saved ahead (if any) is trained next, then each batch is one weight '
        'version old; with 2 or more, the streamed groups the checkpoint saved (if any) are '
        'trained when they fit the new bound, the others generated again; with 0, what was '
        'saved ahead is dropped and the step generates anew'),
    'max_steps': (
        'the run now ends at step {new} instead of {old}; schedules sized by the number of '
        'steps (learning-rate schedules, the last validation) follow the new end'),
}


def describe_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """One line per setting that differs between ``saved`` and ``current``.

    Settings missing from ``saved`` (checkpoints of earlier versions) are not compared.
    """
    lines = []
    for key, meaning in MEANINGS.items():
        if key not in saved or key not in current or saved[key] == current[key]:
            continue
        old, new = saved[key], current[key]
        lines.append(f'{key}: {old!r} -> {new!r}: ' + meaning.format(old=old, new=new))
    return lines


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


def restore_processor_state(processor: Any, state: Any, saved: dict[str, Any] | None) -> None:
    """Loads an advantage processor's checkpointed state into ``state`` (its live state).

    Args:
        processor: the run's advantage processor.
        state: its state object (``processor.init_state()``); None for a stateless one.
        saved: the checkpoint's ``dict(processor=<class name>, state=...)``, or None.

    A missing entry, or one of another processor class, leaves the state fresh and
    says so in the log.
    """
    if state is None:
        return
    current = type(processor).__name__
    if saved is None:
        print_log(f'checkpoint has no advantage state for {current}; its state (e.g. '
                  "GEPO's entropy band) starts fresh", logger='current', level=logging.WARNING)
    elif saved['processor'] != current:
        print_log(f'checkpoint holds {saved["processor"]} state but this run uses '
                  f'{current}; the advantage state starts fresh', logger='current',
                  level=logging.WARNING)
    else:
        state.load_state_dict(saved['state'])
        print_log(f'restored {current} state: {saved["state"]}', logger='current')


def saved_rank_entry(state: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """This rank's entry of a loop checkpoint (:func:`rank_entry` of its ``ranks``), and a
    warning or None.

    Checkpoints of earlier versions hold one entry at the top level (rank 0's ``rng``,
    ``policy_loss``, ``rollout``): every rank takes it, with a warning when there are
    several ranks.
    """
    if 'ranks' in state:
        return rank_entry(state['ranks'])
    entry = {k: state[k] for k in ('rng', 'policy_loss', 'rollout') if k in state}
    return entry, None if dist_world_size() == 1 else (
        'the checkpoint holds the random state of rank 0 only (written by an earlier '
        'version): every rank continues from it, so the run will not repeat an '
        'uninterrupted one exactly')


def resume_streams(entry: dict[str, Any] | None, seed: int | None, step: int) -> None:
    """Sets this rank's saved random streams (once the used prompts are skipped), or seeds
    streams of its own when it has no entry (:func:`seed_streams`)."""
    if entry is None:
        seed_streams(seed, dist_rank(), step)
    elif entry.get('rng') is not None:
        restore_rng(entry['rng'])

