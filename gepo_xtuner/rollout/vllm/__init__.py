"""vLLM as the rollout server: its OpenAI-compatible HTTP protocol, server processes and
in-place weight pushes.

* :mod:`.backend`: :class:`VLLMRolloutBackend` (registered as ``VLLMRolloutBackend``);
* :mod:`.protocol`: ``/v1/completions`` bodies and answers with token ids and logprobs;
* :mod:`.server`: :class:`VLLMServerProcess`, a ``vllm serve`` launched by rank 0;
* ``worker_extension/gepo_vllm_worker.py``: runs inside the server's workers (the reload).

The backend is a :class:`~gepo_xtuner.rollout.server.backend.ServerRolloutBackend`; it
imports nothing of :mod:`gepo_xtuner.rollout.lmdeploy`.
"""

from .backend import VLLMRolloutBackend, VLLMServerError, start_command

__all__ = ['VLLMRolloutBackend', 'VLLMServerError', 'start_command']
