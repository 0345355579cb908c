"""Policies: the mmengine RL policy and the tiny character-level CPU model with its warm start."""

from .policy import RLPolicy
from .tiny import (ALPHABET, SPECIAL_TOKENS, answer_loss, build_char_tokenizer, build_sft_batch,
                   build_tiny_model, format_prompt, greedy_accuracy, greedy_answers, load_tiny,
                   read_warm_start_report, warm_start)

__all__ = [
    'RLPolicy', 'ALPHABET', 'SPECIAL_TOKENS', 'answer_loss', 'build_char_tokenizer', 'build_sft_batch',
    'build_tiny_model', 'format_prompt', 'greedy_accuracy', 'greedy_answers', 'load_tiny',
    'read_warm_start_report', 'warm_start'
]
