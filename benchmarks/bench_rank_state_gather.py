"""CPU benchmark: the per-step gather of every rank's random state to rank 0.

At the end of every RL step the loop gathers each rank's RNG states (torch, NumPy,
Python; CUDA where present), its policy loss's generator state and its rollout
counters (``gepo_xtuner.engine.state.run_state.gather_rank_states``: one
``all_gather_object``), so that a checkpoint holds every rank's streams. This runs
that gather between ``--ranks`` gloo processes on this machine, with the payload the
loop builds (``capture_rng()`` plus a loss's generator state and the rollout
backend's counter), and prints the pickled size per rank and the median time per gather.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_rank_state_gather.py [--ranks 2 3] [--repeats 100]
"""

import argparse
import os
import pickle
import socket
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a checkout without installing


def _payload() -> dict:
    """One rank's entry of the loop's run state (``RLTrainLoop.state_dict()['ranks'][r]``)
    with the largest state the shipped parts keep: a seeded Clip-Cov / KL-Cov loss (one
    generator per device) and the LMDeploy backend (its weight-update counter)."""
    import torch
    from gepo_xtuner.engine.state.run_state import capture_rng
    gen = torch.Generator().manual_seed(0)
    return dict(rng=capture_rng(), policy_loss={'cpu': gen.get_state()},
                rollout={'num_updates': 12})


def _worker(rank: int, world: int, port: int, repeats: int, queue) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                            world_size=world)
    from gepo_xtuner.engine.state.run_state import gather_rank_states
    mine = _payload()
    for _ in range(5):  # warm-up: connections, pickler
        gather_rank_states(mine)
    times = []
    for _ in range(repeats):
        dist.barrier()
        t = time.perf_counter()
        gather_rank_states(mine)
        times.append(time.perf_counter() - t)
    if rank == 0:
        queue.put((len(pickle.dumps(mine)), statistics.median(times)))
    dist.barrier()  # no rank tears its connections down while a peer still uses them
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--ranks', type=int, nargs='+', default=[2, 3])
    parser.add_argument('--repeats', type=int, default=100)
    args = parser.parse_args()

    import torch.multiprocessing as mp
    ctx = mp.get_context('spawn')
    print(f'all_gather_object of one rank state per rank, gloo, median of {args.repeats}')
    print('ranks | bytes per rank | ms per gather')
    for world in args.ranks:
        queue = ctx.SimpleQueue()
        port = _free_port()
        procs = [ctx.Process(target=_worker, args=(r, world, port, args.repeats, queue))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
            if p.exitcode != 0:
                raise SystemExit(f'rank process exited with {p.exitcode}')
        size, median = queue.get()
        print(f'{world:5d} | {size:14d} | {median * 1000:.2f}')


if __name__ == '__main__':
    main()
