"""Two real gloo processes: thresholds are global and identical on every rank."""

import os
import random

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gepo_xtuner.advantage import AdvantageInputs
from gepo_xtuner.registry import ADVANTAGES

from ..conftest import random_batch

STEPS = 4
CFG = dict(type='GEPOAdvantage', gamma=0.4, beta_low=0.3, beta_high=0.1)


def batches():
    rng = random.Random(11)
    return [random_batch(rng, max_groups=12) for _ in range(STEPS)]


def shard(batch: AdvantageInputs, rank: int, world: int) -> tuple[AdvantageInputs, torch.Tensor]:
    """Whole groups per rank (groups are never split across ranks)."""
    _, group_index = torch.unique(batch.group_ids, return_inverse=True)
    keep = group_index % world == rank
    pick = lambda t: None if t is None else t[keep]  # noqa: E731
    return AdvantageInputs(pick(batch.rewards), pick(batch.group_ids), pick(batch.logprobs),
                        pick(batch.mask)), keep


def worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group('gloo', init_method=f'file://{init_file}', rank=rank,
                            world_size=world)
    try:
        proc = ADVANTAGES.build(CFG)
        state = proc.init_state()
        results = []
        for batch in batches():
            local, keep = shard(batch, rank, world)
            out = proc(local, state)
            results.append(dict(keep=keep, adv=out.advantages, metrics=out.metrics,
                                state=state.state_dict()))
        torch.save(results, os.path.join(out_dir, f'rank{rank}.pt'))
    finally:
        dist.destroy_process_group()


def test_two_rank_thresholds_equal_each_other_and_single_process(tmp_path):
    world = 2
    mp.spawn(worker, args=(world, str(tmp_path / 'init'), str(tmp_path)), nprocs=world, join=True)
    ranks = [torch.load(tmp_path / f'rank{r}.pt', weights_only=False) for r in range(world)]

    proc = ADVANTAGES.build(CFG)
    state = proc.init_state()
    shaped = 0
    for step, batch in enumerate(batches()):
        whole = proc(batch, state)
        shaped += int(whole.shaped.sum())
        r0, r1 = ranks[0][step], ranks[1][step]
        # identical on both ranks, bit for bit
        assert r0['state'] == r1['state']
        for key in ('gepo/h_low', 'gepo/h_high', 'gepo/group_nll_mu', 'gepo/group_nll_sigma', 'gepo/num_groups'):
            assert r0['metrics'][key] == r1['metrics'][key], key
            # and equal to one process that sees the whole batch (summation order differs)
            assert abs(r0['metrics'][key] - whole.metrics[key]) < 1e-12, key
        for key in ('h_low', 'h_high'):
            assert abs(r0['state'][key] - state.state_dict()[key]) < 1e-12
        # each rank's advantages are the whole-batch advantages of its responses
        merged = torch.empty_like(whole.advantages)
        for r in ranks:
            merged[r[step]['keep']] = r[step]['adv']
        torch.testing.assert_close(merged, whole.advantages, rtol=0, atol=1e-6)
        assert r0['keep'].any() and r1['keep'].any()
    assert shaped > 0, 'the batches never exercised shaping'
