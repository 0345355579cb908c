"""Policy models: the mmengine RL policy and the built-in tiny CPU model."""

from .policy import RLPolicy
from .tiny import build_char_tokenizer, build_tiny_model, format_prompt

__all__ = ['RLPolicy', 'build_char_tokenizer', 'build_tiny_model', 'format_prompt']
