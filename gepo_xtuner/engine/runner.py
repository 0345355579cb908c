"""An mmengine Runner that trains on CPU-only data-parallel machines and loads its own checkpoints."""

import os
from contextlib import contextmanager
from collections.abc import Iterator

import torch
import torch.distributed as dist
from mmengine.registry import RUNNERS
from mmengine.runner import Runner


@contextmanager
def trusted_checkpoint_load() -> Iterator[None]:
    """Lets ``torch.load`` unpickle mmengine checkpoints (torch >= 2.6 refuses by default).

    mmengine checkpoints hold pickled objects (message-hub buffers, config);
    ``torch.load(weights_only=True)``, torch's default since 2.6, rejects them.
    Unpickling runs code from the file: resume only from checkpoints you trust.
    Scoped to the load; the process-wide default is restored afterwards.
    """
    name = 'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD'
    old = os.environ.get(name)
    os.environ[name] = '1'
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@RUNNERS.register_module()
class RLRunner(Runner):
    """mmengine's Runner with two changes for RL runs of this package.

    - Distributed launch on machines without CUDA: mmengine's ``init_dist`` calls
      ``torch.cuda.set_device`` unconditionally; when CUDA is unavailable this
      runner initialises the process group itself (``gloo`` unless
      ``env_cfg.dist_cfg.backend`` says otherwise, ``env://`` rendezvous as
      torchrun/slurm set it up) before mmengine's environment set-up, which then
      finds it initialised. With CUDA present nothing changes.
    - Checkpoint loading unpickles mmengine's checkpoints (see
      :func:`trusted_checkpoint_load`).

    Config: ``runner_type = 'RLRunner'``. ``xtuner train --deepspeed`` replaces the
    runner with mmengine's FlexibleRunner (GPU only), which keeps mmengine's own
    behaviour.
    """

    def setup_env(self, env_cfg: dict) -> None:
        if self.distributed and not torch.cuda.is_available() and not dist.is_initialized():
            backend = (env_cfg.get('dist_cfg') or {}).get('backend', 'gloo')
            if self.launcher == 'slurm':
                os.environ.setdefault('RANK', os.environ['SLURM_PROCID'])
                os.environ.setdefault('WORLD_SIZE', os.environ['SLURM_NTASKS'])
                os.environ.setdefault('LOCAL_RANK', os.environ['SLURM_LOCALID'])
            dist.init_process_group(backend=backend, init_method='env://')
        super().setup_env(env_cfg)

    def load_checkpoint(self, filename: str, *args, **kwargs):
        with trusted_checkpoint_load():
            return super().load_checkpoint(filename, *args, **kwargs)
