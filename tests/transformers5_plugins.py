"""Test-only helpers for the transformers-5 runs of tests/test_compat_transformers.py.

Run in subprocesses whose PYTHONPATH starts with the transformers-5 overlay:

* ``python -m tests.transformers5_plugins {qwen2,qwen3_5} OUT`` writes a tiny random
  policy (``OUT/model``) with the character tokenizer, and small task files
  (``OUT/data``), like the tiny-model fixture of tests/test_engine, built here by
  transformers 5 itself. ``qwen3_5`` is saved the way Qwen3.5 checkpoints are: the
  multimodal ``Qwen3_5ForConditionalGeneration`` (model_type ``qwen3_5``, language
  model plus vision tower).
* :class:`StackProbeHook`, imported through ``custom_imports``, records what the
  training process actually ran on.
"""

import json
import sys
from pathlib import Path

import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from gepo_xtuner.testbed.synthetic_tasks import build_task_files
from gepo_xtuner.testbed.tiny import BOS_ID, EOS_ID, PAD_ID, build_char_tokenizer, build_tiny_model


def build_tiny_qwen3_5(vocab_size: int, seed: int) -> torch.nn.Module:
    """A ~0.16M-parameter Qwen3.5 (one Gated DeltaNet layer, one attention layer, 1-block ViT).

    Same layer kinds and rotary layout as the real model (partial M-RoPE, linear
    attention then full attention), shrunk. The image/video special tokens take the
    top four ids of the vocabulary, which text prompts never use.
    """
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    text = {
        'vocab_size': vocab_size, 'hidden_size': 64, 'intermediate_size': 128,
        'num_hidden_layers': 2, 'layer_types': ['linear_attention', 'full_attention'],
        'num_attention_heads': 2, 'num_key_value_heads': 1, 'head_dim': 32,
        'linear_num_key_heads': 2, 'linear_num_value_heads': 2, 'linear_key_head_dim': 16,
        'linear_value_head_dim': 16, 'linear_conv_kernel_dim': 4,
        'max_position_embeddings': 128, 'tie_word_embeddings': False,
        # rotary on 8 of the 32 head dims: 4 frequencies = 2 temporal + 1 + 1 spatial sections
        'rope_parameters': {'rope_type': 'default', 'rope_theta': 10_000.0,
                            'partial_rotary_factor': 0.25, 'mrope_section': [2, 1, 1],
                            'mrope_interleaved': True},
        'pad_token_id': PAD_ID, 'bos_token_id': BOS_ID, 'eos_token_id': EOS_ID}
    vision = {'depth': 1, 'hidden_size': 32, 'intermediate_size': 64, 'num_heads': 2,
              'out_hidden_size': 64, 'patch_size': 14, 'num_position_embeddings': 64}
    config = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False,
                           image_token_id=vocab_size - 1, video_token_id=vocab_size - 2,
                           vision_start_token_id=vocab_size - 3,
                           vision_end_token_id=vocab_size - 4)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen3_5ForConditionalGeneration(config).float()


def write_tiny_dir(kind: str, out: Path) -> None:
    """``out/model`` (random ``kind`` policy + tokenizer) and ``out/data`` (task files)."""
    tokenizer = build_char_tokenizer()
    builders = {'qwen2': build_tiny_model, 'qwen3_5': build_tiny_qwen3_5}
    model = builders[kind](len(tokenizer), seed=0)
    model.save_pretrained(out / 'model')
    tokenizer.save_pretrained(out / 'model')
    build_task_files(out / 'data', n_train_per_domain=50, n_val_per_domain=4, seed=0)


@HOOKS.register_module()
class StackProbeHook(Hook):
    """Writes ``<work_dir>/stack_probe.json`` after training.

    Fields: ``transformers`` (version), ``provided`` (names the start-up hook
    added), ``model_class`` and ``model_type`` of the policy, ``changed`` /
    ``total`` parameter tensors that training changed.
    """

    def before_train(self, runner) -> None:
        model = getattr(runner.model, 'module', runner.model)
        self._start = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def after_train(self, runner) -> None:
        import transformers

        import _gepo_xtuner_transformers5 as startup_hook
        model = getattr(runner.model, 'module', runner.model)
        changed = [k for k, v in model.state_dict().items() if not torch.equal(v, self._start[k])]
        probe = {'transformers': transformers.__version__, 'provided': startup_hook.provided,
                 'model_class': type(model.llm).__name__,
                 'model_type': model.llm.config.model_type, 'changed': len(changed),
                 'total': len(self._start)}
        Path(runner.work_dir, 'stack_probe.json').write_text(json.dumps(probe))


if __name__ == '__main__':
    write_tiny_dir(sys.argv[1], Path(sys.argv[2]))
