"""LMDeploy as the rollout server: its HTTP protocol, server processes and weight pushes.

* :mod:`.backend`: :class:`LMDeployRolloutBackend` (registered as ``LMDeployRolloutBackend``);
* :mod:`.protocol`: requests and responses of ``/generate`` and the server's stop rules;
* :mod:`.server`: :class:`LMDeployServerProcess`, a server launched and supervised by rank 0;
* :mod:`.weights`: weight pushes (CUDA IPC, NCCL groups, disk).

The generic HTTP client and server pool are in :mod:`gepo_xtuner.rollout.server`.
"""

from .backend import LMDeployRolloutBackend, LMDeployServerError

__all__ = ['LMDeployRolloutBackend', 'LMDeployServerError']
