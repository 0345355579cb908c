"""One RL step's trainer side outside a runner: a Qwen2 built from a config, a workload of
ragged responses and the loop's own old-logprob pass and update on them.

``benchmarks/bench_rl_step.py`` times these; the GPU tests (``tests/test_gpu``) run them
on CUDA. The step is the RL loop's code itself, the public functions of
:mod:`gepo_xtuner.engine.step.update` (``old_logprobs``, then ``ppo_update``: ``micro_batches``
-> ``RLPolicy`` -> ``optimizer_step``), with the settings of :func:`step_settings`.
"""

import math
from pathlib import Path
from typing import Any

import torch

__all__ = ['QWEN2_0_5B', 'build_qwen2', 'workload', 'step_settings', 'adamw', 'rl_step']

QWEN2_0_5B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, intermediate_size=4864, vocab_size=151936)
"""The layer shapes of Qwen2.5-0.5B (494M parameters with its vocabulary, tied head)."""


def build_qwen2(path: Path, vocab: int, hidden: int, layers: int, *, heads: int | None = None,
                kv_heads: int | None = None, intermediate: int | None = None,
                seed: int = 0, max_positions: int = 4096, dtype: torch.dtype = torch.float32,
                **overrides: Any) -> int:
    """Writes a randomly initialised Qwen2 and the character tokenizer to ``path``.

    Args:
        path: the model directory to write (``from_pretrained`` loads it).
        vocab: embedding rows; ids the tokenizer lacks decode to nothing.
        hidden, layers: width and depth.
        heads, kv_heads: attention heads (default ``hidden // 64``) and key/value heads
            (default: ``heads``).
        intermediate: MLP width (default ``hidden * 11 // 4``).
        seed: the weights are a pure function of it and the shapes.
        max_positions: ``max_position_embeddings``.
        dtype: the dtype the weights are saved in (and the config's ``torch_dtype``).
        **overrides: any other :class:`~transformers.Qwen2Config` field (e.g. a larger
            ``initializer_range`` for peaked, context-dependent logits).

    Returns:
        The number of parameters (the tied head counted once).
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from .tiny import build_char_tokenizer
    heads = heads or max(1, hidden // 64)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
                         intermediate_size=intermediate or hidden * 11 // 4,
                         max_position_embeddings=max_positions, tie_word_embeddings=True,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.to(dtype).save_pretrained(path)
    build_char_tokenizer().save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def workload(n: int, median: float, sigma: float, max_len: int, vocab: int, seed: int,
             prompt_lengths: tuple[int, int] = (6, 14)) -> tuple[Any, torch.Tensor]:
    """``n`` responses of log-normal length and their prompts, as the loop batches them.

    Args:
        n: responses (one per prompt).
        median, sigma: response length ``exp(log(median) + sigma * z)``, rounded and
            clamped to ``[2, max_len]``.
        max_len: the longest response.
        vocab: token ids are drawn from ``[4, vocab)`` (ids 0-3 are special).
        seed: everything is a pure function of it.
        prompt_lengths: prompt lengths in tokens, drawn uniformly (inclusive).

    Returns:
        ``(ResponseBatch, advantages (n,))``: rollout logprobs 0, advantages standard normal.
    """
    from ..engine.step.batching import build_response_batch
    from ..rollout import RolloutSample
    gen = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(prompt_lengths[0], prompt_lengths[1] + 1, (n, ), generator=gen)
    length = torch.exp(math.log(median) + sigma * torch.randn(n, generator=gen))
    length = length.round().long().clamp(2, max_len)
    prompts = [torch.randint(4, vocab, (int(p), ), generator=gen).tolist() for p in prompt_len]
    samples = [[RolloutSample(torch.randint(4, vocab, (int(r), ), generator=gen).tolist(),
                              [0.0] * int(r), 'stop')] for r in length]
    batch = build_response_batch(prompts, samples, pad_token_id=0)
    return batch, torch.randn(n, generator=gen)


def step_settings(max_tokens: int, minibatch: int, temperature: float = 1.0) -> Any:
    """The update's settings for one process: ``max_tokens`` per micro-batch in both passes,
    ``minibatch`` responses per optimizer step, one PPO epoch, logits divided by
    ``temperature`` (default 1), length norm 4096."""
    from ..engine.step.update import UpdateSettings
    return UpdateSettings(minibatch, ppo_epochs=1, max_tokens_per_micro_batch=max_tokens,
                          logprob_max_tokens_per_micro_batch=max_tokens,
                          temperature=temperature, norm_length=4096)


def adamw(policy: Any, lr: float = 1e-6) -> Any:
    """An mmengine ``OptimWrapper`` of AdamW (betas 0.9/0.99) clipping gradients at 1."""
    from mmengine.optim import OptimWrapper
    return OptimWrapper(torch.optim.AdamW(policy.parameters(), lr=lr, betas=(0.9, 0.99)),
                        clip_grad=dict(max_norm=1.0))


def rl_step(policy: Any, optim_wrapper: Any, batch: Any, advantages: torch.Tensor,
            settings: Any) -> dict[str, float]:
    """The loop's old-logprob pass, then its update (one optimizer step per minibatch).

    Args:
        policy: the :class:`~gepo_xtuner.model.RLPolicy`.
        optim_wrapper: e.g. :func:`adamw`.
        batch: the step's ``ResponseBatch`` (on the CPU; micro-batches are moved).
        advantages: ``(N,)``.
        settings: :class:`~gepo_xtuner.engine.step.update.UpdateSettings`, e.g.
            :func:`step_settings`.

    Returns:
        The update's metrics (``optim/grad_norm``, ``loss/pg``, ...).
    """
    from ..engine.step.update import old_logprobs, ppo_update
    old, _ = old_logprobs(policy, batch, settings)
    return ppo_update(policy, optim_wrapper, batch, old, advantages, None, settings)
