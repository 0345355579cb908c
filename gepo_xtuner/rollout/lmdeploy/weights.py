"""Pushing the trainer's weights into an LMDeploy server: CUDA IPC, NCCL broadcast, or disk.

The payloads follow LMDeploy 0.18's server side (``lmdeploy/serve/openai/protocol.py``:
``UpdateParamsRequest``, ``InitWeightsUpdateGroupRequest``,
``UpdateWeightsFromDistributedRequest``; ``pytorch/engine/model_agent/agent.py``), and
XTuner v1's trainer drives the same endpoints:

* ``ipc`` (server on the trainer's GPU): ``POST /update_weights`` with
  ``serialized_named_tensors`` = base64 of a ``ForkingPickler`` dump of
  ``[(name, torch.multiprocessing.reductions.reduce_tensor(t)), ...]``. The server
  rebuilds each CUDA tensor from its IPC handle (on its own current device), copies
  it into the model and, on the request with ``finished=True``, runs its
  post-loading hooks. Tensors must stay alive until the request returns.
* ``nccl`` (server on other GPUs): once ``POST /init_weights_update_group`` (the trainer
  is rank 0 of a new group, the server's TP ranks ``1..tp``); per bucket
  ``POST /update_weights_from_distributed`` with ``names``/``dtypes``/``shapes`` while
  rank 0 broadcasts the tensors in that order.
* ``disk``: LMDeploy has no endpoint that loads weights from a path, so the weights
  are saved with ``save_pretrained`` (safetensors) to ``shared_dir/step_N``
  (:func:`~gepo_xtuner.rollout.server.weights.save_weights`) and the server the backend
  launched is restarted on that directory.

The parameters' checkpoint names and their buckets are engine-independent
(:mod:`gepo_xtuner.rollout.server.weights`).
"""

import base64
import concurrent.futures as cf
import io
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
from torch import nn

from ..server.http import HTTPPool, ServerRequestError
from ..server.probe import check_probe_setting
from ..server.process import free_port
from ..server.weights import buckets, named_weights

MODES: dict[str, frozenset[str]] = {
    'none': frozenset(),
    'ipc': frozenset({'bucket_bytes', 'dtype', 'sleep_level', 'probe_tolerance'}),
    'nccl': frozenset({'bucket_bytes', 'dtype', 'master_address', 'master_port', 'group_name',
                       'backend', 'server_tp', 'timeout_s', 'probe_tolerance'}),
    'disk': frozenset({'shared_dir', 'keep', 'probe_tolerance'}),
}


def check_weight_sync(cfg: dict | None) -> dict | None:
    """Validates a ``weight_sync`` config; returns a copy (``None`` stays ``None``).

    Raises:
        ValueError: unknown mode or key, a missing ``shared_dir`` for ``disk``, or a
            ``probe_tolerance`` that is not a positive number or ``None`` (or is given
            with mode ``'none'``).
    """
    if cfg is None:
        return None
    if not isinstance(cfg, dict) or cfg.get('mode') not in MODES:
        raise ValueError(f"weight_sync must be a dict with mode in {sorted(MODES)}, got {cfg!r}")
    cfg = dict(cfg)
    check_probe_setting(cfg)  # before the key check: mode 'none' says why it takes none
    unknown = set(cfg) - {'mode'} - MODES[cfg['mode']]
    if unknown:
        raise ValueError(f"weight_sync mode {cfg['mode']!r} does not take {sorted(unknown)}; "
                         f"it takes {sorted(MODES[cfg['mode']])}")
    if cfg['mode'] == 'disk' and not cfg.get('shared_dir'):
        raise ValueError("weight_sync mode 'disk' needs shared_dir (a directory the server can "
                         "read), e.g. dict(mode='disk', shared_dir='work_dirs/rollout_weights')")
    if cfg.get('dtype') is not None:
        _dtype(cfg['dtype'])
    if 'bucket_bytes' in cfg and not (isinstance(cfg['bucket_bytes'], int)
                                      and cfg['bucket_bytes'] > 0):
        raise ValueError(f"weight_sync.bucket_bytes must be a positive int, got "
                         f"{cfg['bucket_bytes']!r}")
    if cfg.get('sleep_level', 1) not in (1, 2):
        raise ValueError(f"weight_sync.sleep_level must be 1 or 2, got {cfg['sleep_level']!r}")
    return cfg


def _dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    if name is None or isinstance(name, torch.dtype):
        return name
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"weight_sync.dtype must name a floating torch dtype such as 'bfloat16', "
                         f'got {name!r}')
    return dtype


def _last_flagged(items: Iterator[Any]) -> Iterator[tuple[Any, bool]]:
    """``(item, is_last)`` pairs, so the last bucket can carry ``finished=True``."""
    prev, has_prev = None, False
    for item in items:
        if has_prev:
            yield prev, False
        prev, has_prev = item, True
    if has_prev:
        yield prev, True


def serialize_ipc(named: list[tuple[str, torch.Tensor]]) -> str:
    """Base64 of ``[(name, reduce_tensor(t)), ...]`` pickled as LMDeploy's server reads it.

    Only CUDA tensors make sense here: the server rebuilds them from CUDA IPC handles.
    """
    from multiprocessing.reduction import ForkingPickler

    from torch.multiprocessing.reductions import reduce_tensor
    buf = io.BytesIO()
    ForkingPickler(buf).dump([(name, reduce_tensor(t)) for name, t in named])
    return base64.b64encode(buf.getvalue()).decode('ascii')


def push_ipc(pool: HTTPPool, model: nn.Module, cfg: dict) -> int:
    """Sends all parameters over CUDA IPC in buckets; returns the number of requests.

    Raises:
        RuntimeError: a parameter is not on a CUDA device.
    """
    dtype = _dtype(cfg.get('dtype'))
    count = 0
    for bucket, last in _last_flagged(buckets(named_weights(model, dtype),
                                              int(cfg.get('bucket_bytes', 512 << 20)))):
        not_cuda = [n for n, t in bucket if not t.is_cuda]
        if not_cuda:
            raise RuntimeError(f"weight_sync mode 'ipc' shares CUDA memory with a server on the "
                               f'same GPU, but {not_cuda[0]} is on CPU; use mode nccl or disk')
        # the server reads this memory on its own stream, in its own process: nothing orders
        # that read after the kernels still writing it here (the optimizer step, a cast), so
        # they must be finished before the handles leave
        for device in {t.device for _, t in bucket}:
            torch.cuda.synchronize(device)
        pool.request('POST', '/update_weights', retries=0,
                     json={'serialized_named_tensors': serialize_ipc(bucket), 'finished': last})
        count += 1
    return count


class NCCLWeightSync:
    """The trainer's end of LMDeploy's ``*_weights_update_group`` protocol.

    The trainer (rank 0) and the server's ``server_tp`` ranks form a new process group
    by TCP rendezvous at ``master_address:master_port``; the server joins it when it
    handles ``POST /init_weights_update_group``. ``backend='gloo'`` (CPU tensors) works
    against a server that accepts it, which is how the protocol is tested on CPU;
    LMDeploy's engine itself receives on CUDA, so use ``'nccl'`` with it.

    Each request runs beside our side of the collective (the server answers only once
    both sides took part), so a server that refuses is reported at once instead of
    after the rendezvous or broadcast times out.
    """

    def __init__(self, pool: HTTPPool, cfg: dict) -> None:
        self.pool = pool
        self.backend = cfg.get('backend', 'nccl')
        self.group_name = cfg.get('group_name', 'gepo_weight_sync')
        self.master_address = cfg.get('master_address', '127.0.0.1')
        self.master_port = cfg.get('master_port')
        self.server_tp = int(cfg.get('server_tp', 1))
        self.timeout = timedelta(seconds=float(cfg.get('timeout_s', 600)))
        self.bucket_bytes = int(cfg.get('bucket_bytes', 512 << 20))
        self.dtype = _dtype(cfg.get('dtype'))
        self.device = 'cuda' if self.backend == 'nccl' else 'cpu'
        self.group = None
        self._threads = cf.ThreadPoolExecutor(2, thread_name_prefix='weight-sync')

    def _together(self, path: str, body: dict, collective: Callable[[], Any]) -> Any:
        """POSTs ``body`` and runs ``collective`` at the same time; returns its result."""
        post = self._threads.submit(self.pool.request, 'POST', path, json=body, retries=0,
                                    timeout_s=self.timeout.total_seconds())
        ours = self._threads.submit(collective)
        cf.wait([post, ours], return_when=cf.FIRST_EXCEPTION)
        answer = post.result() if post.done() else None  # raises the server's error first
        result = ours.result()
        answer = post.result() if answer is None else answer
        if not (answer or {}).get('success', False):
            raise ServerRequestError(f'POST {self.pool.base_url}{path}: the server refused: '
                                     f'{(answer or {}).get("message", answer)}', 200, answer)
        return result

    def init_group(self) -> None:
        """Creates the process group with the server (once)."""
        if self.group is not None:
            return
        if self.master_port is None:
            self.master_port = free_port(self.master_address)
        world_size = self.server_tp + 1
        body = {'master_address': self.master_address, 'master_port': int(self.master_port),
                'rank_offset': 1, 'world_size': world_size, 'group_name': self.group_name,
                'backend': self.backend}
        self.group = self._together('/init_weights_update_group', body,
                                    lambda: self._new_group(world_size))

    def _new_group(self, world_size: int) -> Any:
        # The same construction as the server's side, so both sides' store keys agree;
        # torch has no public API for a group outside the default world, so this uses
        # torch's private helpers; a torch without them is
        # reported here, not as an AttributeError in the middle of a weight push.
        try:
            from torch.distributed.distributed_c10d import (
                PrefixStore,
                _new_process_group_helper,
                _world,
                rendezvous,
            )
        except ImportError as exc:
            raise RuntimeError(
                f'weight sync over NCCL needs torch.distributed internals this torch '
                f'({torch.__version__}) lacks ({exc}); use weight_sync=dict(mode=\'ipc\') or '
                "dict(mode='disk', shared_dir=...), or a torch version LMDeploy supports") from exc
        if not hasattr(_world, 'pg_group_ranks'):
            raise RuntimeError(f'torch {torch.__version__} changed the process-group registry '
                               "(_world.pg_group_ranks); use weight_sync=dict(mode='ipc') or "
                               "dict(mode='disk', shared_dir=...)")
        store, _, _ = next(rendezvous(f'tcp://{self.master_address}:{self.master_port}', 0,
                                      world_size, timeout=self.timeout))
        store.set_timeout(self.timeout)
        group, _ = _new_process_group_helper(world_size, 0, [], self.backend,
                                             PrefixStore(self.group_name, store),
                                             group_name=self.group_name, timeout=self.timeout)
        _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
        return group

    def push(self, model: nn.Module) -> int:
        """Broadcasts all parameters bucket by bucket; returns the number of buckets."""
        import torch.distributed as dist
        self.init_group()
        count = 0
        named = named_weights(model, self.dtype, self.device)
        for bucket, last in _last_flagged(buckets(named, self.bucket_bytes)):
            body = {'names': [n for n, _ in bucket],
                    'dtypes': [str(t.dtype).removeprefix('torch.') for _, t in bucket],
                    'shapes': [list(t.shape) for _, t in bucket],
                    'group_name': self.group_name, 'finished': last}

            def send(bucket=bucket) -> None:
                for _, t in bucket:  # in the order of `names`, as the server receives
                    dist.broadcast(t, src=0, group=self.group)
            self._together('/update_weights_from_distributed', body, send)
            count += 1
        return count

    def close(self) -> None:
        """Tears the group down on both sides (best effort: the server may be gone)."""
        self._threads.shutdown(wait=False, cancel_futures=True)
        if self.group is None:
            return
        import torch.distributed as dist
        try:
            self.pool.request('POST', '/destroy_weights_update_group', retries=0, timeout_s=30,
                              json={'group_name': self.group_name})
        except ServerRequestError:
            pass
        dist.destroy_process_group(self.group)
        self.group = None
