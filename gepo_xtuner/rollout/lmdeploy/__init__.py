"""LMDeploy as the rollout server: its HTTP protocol, server processes and weight pushes.

* :mod:`.backend`: :class:`LMDeployRolloutBackend` (registered as ``LMDeployRolloutBackend``);
* :mod:`.protocol`: requests and responses of ``/generate`` and the server's stop rules;
* :mod:`.server`: :class:`LMDeployServerProcess`, LMDeploy's command for a server launched
  by rank 0;
* :mod:`.weights`: weight pushes (CUDA IPC, NCCL groups; disk mode saves files with
  :func:`~gepo_xtuner.rollout.server.weights.save_weights`).

The backend is a :class:`~gepo_xtuner.rollout.server.backend.ServerRolloutBackend`: the
launch-or-attach, readiness, server pool, push round and errors are
:mod:`gepo_xtuner.rollout.server`'s.
"""

from .backend import LMDeployRolloutBackend, LMDeployServerError

__all__ = ['LMDeployRolloutBackend', 'LMDeployServerError']
