"""Runs inside vLLM's worker processes (imports vLLM and torch only, never this package).

``vllm serve ... --worker-extension-cls gepo_vllm_worker.GEPOWorkerExtension`` with this
directory on the server's ``PYTHONPATH`` adds the methods below to every worker; the
trainer calls them through ``POST /collective_rpc`` (a server started with
``VLLM_SERVER_DEV_MODE=1``).

Why not vLLM's own ``reload_weights``: on the CPU backend, vLLM 0.32 packs the weight of
an ``lm_head`` that is tied to the input embeddings into a oneDNN matrix handle when the
model loads, and an in-place reload updates the embedding table but not that handle. The
server then embeds tokens with the new weights and computes logits with the old ones: on
the demo's tiny Qwen2 (tied embeddings) its logprobs differed from the trainer's by up to
0.8 nats/token after one push, while the tokens it sampled did change. Rebuilding the
handle after the reload brings the difference back to float32 rounding (6e-6).
"""

from typing import Any


class GEPOWorkerExtension:
    """Mixed into vLLM's worker class (``self`` is the worker)."""

    def gepo_reload_weights(self, weights_path: str) -> dict[str, Any]:
        """Reloads the weights in ``weights_path`` in place, then rebuilds the CPU matrix
        handles of embedding-backed heads from their (new) weights.

        Returns:
            ``{'rebuilt': n}``: the number of heads whose handle was rebuilt.
        """
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            UnquantizedEmbeddingMethod,
        )
        self.model_runner.reload_weights(weights_path=weights_path)
        rebuilt = 0
        for module in self.model_runner.get_model().modules():
            method = getattr(module, 'quant_method', None)
            if isinstance(method, UnquantizedEmbeddingMethod) and hasattr(module, 'cpu_linear'):
                method.process_weights_after_loading(module)  # keeps the weight itself
                rebuilt += 1
        return {'rebuilt': rebuilt}
