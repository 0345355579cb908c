"""A tiny character-level policy for the synthetic task mix, trainable on a laptop CPU.

Everyone that feeds the model a task (warm start, RL rollouts, validation) must
build the text with :func:`format_prompt` and stop at ``<eos>``; the model's
answer is the decoded text between the two.
"""

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from ..data.synthetic_tasks import (DOMAINS, MAX_ANSWER_CHARS, build_task_files,
                                    generate_split, score)

SPECIAL_TOKENS: tuple[str, ...] = ('<pad>', '<bos>', '<eos>', '<unk>')
# Fixed, so ids never depend on the task mix; a few spare symbols leave room for
# new domains without changing the vocabulary of saved models.
ALPHABET: str = '0123456789abcdefghijklmnopqrstuvwxyz+-*/=:,.()<>?! '
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer over :data:`ALPHABET` that prepends ``<bos>``.

    Left padding, because batched generation appends on the right.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + tuple(ALPHABET))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token='<unk>'))
    core.pre_tokenizer = pre_tokenizers.Split(Regex('.'), behavior='isolated')
    core.post_processor = processors.TemplateProcessing(
        single='<bos> $A', pair='<bos> $A $B:1', special_tokens=[('<bos>', BOS_ID)])
    core.decoder = decoders.Fuse()  # the default decoder would join chars with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token='<pad>', bos_token='<bos>', eos_token='<eos>',
        unk_token='<unk>', padding_side='left', clean_up_tokenization_spaces=False,
        model_max_length=128, model_input_names=['input_ids', 'attention_mask'])


def format_prompt(prompt: str) -> str:
    """The text the model sees before its answer; the answer is followed by ``<eos>``.

    >>> format_prompt('47+85')
    '47+85='
    """
    return prompt + '='


def build_tiny_model(vocab_size: int, seed: int, **overrides) -> Qwen2ForCausalLM:
    """A ~0.4M-parameter Qwen2 decoder in float32, initialised deterministically.

    Args:
        vocab_size: rows of the (tied) embedding, ``len(tokenizer)``.
        seed: the weights are a pure function of the seed and the config; the global
            torch RNG is left untouched.
        **overrides: any :class:`~transformers.Qwen2Config` field.
    """
    cfg = dict(vocab_size=vocab_size, hidden_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=4, intermediate_size=384,
               max_position_embeddings=128, tie_word_embeddings=True, attention_dropout=0.0,
               rope_theta=10_000.0, pad_token_id=PAD_ID, bos_token_id=BOS_ID,
               eos_token_id=EOS_ID, torch_dtype='float32', use_cache=True,
               attn_implementation='eager')
    cfg.update(overrides)
    config = Qwen2Config(**cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).float()
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.bos_token_id = config.bos_token_id
    return model


def build_sft_batch(tokenizer: PreTrainedTokenizerFast,
                    records: Sequence[dict]) -> dict[str, torch.Tensor]:
    """Teacher-forcing batch of ``format_prompt(prompt) + answer + <eos>``.

    Right-padded (positions then match unpadded sequences); ``labels`` are -100
    everywhere except on the answer and its ``<eos>``, so only answers are learnt.
    """
    rows = []
    for rec in records:
        prompt_ids = tokenizer(format_prompt(rec['prompt']))['input_ids']
        answer_ids = tokenizer(rec['answer'], add_special_tokens=False)['input_ids']
        rows.append((prompt_ids, answer_ids + [tokenizer.eos_token_id]))
    width = max(len(p) + len(a) for p, a in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        n = len(p) + len(a)
        input_ids[i, :n] = torch.tensor(p + a)
        labels[i, len(p):n] = torch.tensor(a)
        attention_mask[i, :n] = 1
    return {'input_ids': input_ids, 'attention_mask': attention_mask, 'labels': labels}


@torch.no_grad()
def answer_loss(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast,
                records: Sequence[dict], batch_size: int = 64) -> float:
    """Mean cross-entropy per answer token (``<eos>`` included) under teacher forcing."""
    total, count = 0.0, 0
    for start in range(0, len(records), batch_size):
        batch = build_sft_batch(tokenizer, records[start:start + batch_size])
        n = int((batch['labels'][:, 1:] != -100).sum())
        total += float(model(**batch).loss) * n  # HF averages over shifted labels
        count += n
    return total / max(count, 1)


@torch.no_grad()
def greedy_accuracy(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast,
                    records: Sequence[dict], batch_size: int = 64,
                    max_new_tokens: int = MAX_ANSWER_CHARS + 1) -> dict[str, float]:
    """Exact-match accuracy of greedy answers, per domain (domains in first-seen order)."""
    was_training = model.training
    model.eval()
    hits: dict[str, list[float]] = {}
    try:
        for start in range(0, len(records), batch_size):
            chunk = records[start:start + batch_size]
            enc = tokenizer([format_prompt(r['prompt']) for r in chunk], return_tensors='pt',
                            padding=True)
            out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                                 pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
            texts = tokenizer.batch_decode(out[:, enc['input_ids'].shape[1]:],
                                           skip_special_tokens=True)
            for rec, text in zip(chunk, texts):
                hits.setdefault(rec['domain'], []).append(
                    score(rec['domain'], text, rec['answer']))
    finally:
        model.train(was_training)
    return {d: sum(v) / len(v) for d, v in hits.items()}
