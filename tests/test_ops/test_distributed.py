"""Where collectives run: the device decision for every backend, without needing a GPU."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gepo_xtuner.ops.distributed import (all_reduce, all_reduce_sum, backend_devices,
                                         collective_device, reduce_in_group)


@pytest.mark.parametrize('backend,tensor,expected', [
    ('gloo', 'cpu', 'cpu'),
    ('gloo', 'cuda:0', 'cuda:0'),  # gloo reduces CUDA tensors through the host itself
    ('nccl', 'cuda:1', 'cuda:1'),
    ('nccl', 'cpu', 'cuda:3'),  # NCCL serves CUDA only: a CPU tensor goes to this rank's GPU
    ('cpu:gloo,cuda:nccl', 'cpu', 'cpu'),
    ('cpu:gloo,cuda:nccl', 'cuda:2', 'cuda:2'),
    ('mpi', 'cpu', 'cpu'),
])
def test_collective_device(backend, tensor, expected):
    assert collective_device(backend, tensor, accelerator='cuda:3') == torch.device(expected)


def test_nccl_without_a_gpu_says_what_to_do():
    if torch.cuda.is_available():
        pytest.skip('this process has a GPU')
    with pytest.raises(RuntimeError, match='no cuda device.*gloo'):
        collective_device('nccl', 'cpu')


def test_backend_strings():
    assert backend_devices('NCCL') == {'cuda': 'nccl'}
    assert backend_devices('gloo') == {'cpu': 'gloo', 'cuda': 'gloo'}
    assert backend_devices('cpu:gloo,cuda:nccl') == {'cpu': 'gloo', 'cuda': 'nccl'}


def test_single_process_is_a_no_op():
    t = torch.tensor([1.0, 2.0])
    assert all_reduce_sum(t) is t and t.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match='op must be one of'):
        all_reduce(t, 'mean')


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=2)
    try:
        s = all_reduce(torch.tensor([rank + 1.0], dtype=torch.float64))
        m = all_reduce(torch.tensor([rank * 3.0]), 'max')
        n = all_reduce(torch.tensor([rank * 3.0]), 'min')
        torch.save(dict(sum=s.item(), max=m.item(), min=n.item()), f'{out}.{rank}')
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_reduce(tmp_path):
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    mp.spawn(_worker, args=(port, str(tmp_path / 'r')), nprocs=2, join=True)
    for rank in (0, 1):
        assert torch.load(tmp_path / f'r.{rank}') == dict(sum=3.0, max=3.0, min=0.0)


def test_reduce_in_group_runs_the_collective_in_a_one_rank_group(tmp_path):
    """The path all_reduce skips for one process (the GPU checks run it under NCCL)."""
    dist.init_process_group('gloo', init_method=f'file://{tmp_path / "store"}', rank=0,
                            world_size=1)
    try:
        t = torch.tensor([1.5, -2.0], dtype=torch.float64)
        assert reduce_in_group(t, 'max') is t and t.tolist() == [1.5, -2.0]
    finally:
        dist.destroy_process_group()
