"""Collectives with NCCL on one GPU (world size 1), and the device decision for each backend.

Every collective of the package goes through ``gepo_xtuner.ops.distributed``, whose
``collective_device`` decides where a tensor must be for the group's backend: under NCCL a
CPU tensor (the loop's statistics are CPU float64) is copied to the GPU and back; under
``'cpu:gloo,cuda:nccl'`` each device keeps its tensors. Here the real path
(``reduce_in_group``) runs in a one-rank group of each backend on CPU and CUDA tensors; the
values must come back unchanged (a one-rank sum) on the tensor's own device, and NCCL itself
must refuse a CPU tensor (the reason the decision exists).
"""

import pytest
import torch
import torch.distributed as dist

from gepo_xtuner.ops.distributed import collective_device, reduce_in_group
from gepo_xtuner.testbed.gpu import record
from tests.test_engine.conftest import free_port

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize('backend', ['nccl', 'cpu:gloo,cuda:nccl'])
def test_reductions_run_on_the_device_the_backend_serves(backend, device) -> None:
    dist.init_process_group(backend, init_method=f'tcp://127.0.0.1:{free_port()}', rank=0,
                            world_size=1)
    figures = {'backend': str(dist.get_backend())}
    try:
        for where in ('cpu', 'cuda'):
            values = torch.tensor([1.5, -2.0, 3.25], dtype=torch.float64, device=where)
            for op in ('sum', 'max', 'min'):
                out = reduce_in_group(values.clone(), op)
                assert out.device == values.device and torch.equal(out, values), (where, op, out)
            figures[f'{where}_tensor_reduced_on'] = str(
                collective_device(str(dist.get_backend()), values.device))
        if backend == 'nccl':
            with pytest.raises(Exception):  # noqa: B017 - NCCL's own error type varies
                dist.all_reduce(torch.ones(2))
            figures['nccl_refuses_cpu_tensor'] = True
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()
    expected = {'nccl': 'cuda:0', 'cpu:gloo,cuda:nccl': 'cpu'}[backend]
    assert figures['cpu_tensor_reduced_on'] == expected, figures
    record(f'collectives[{backend}]', figures)
