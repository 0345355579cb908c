"""A tiny character-level policy for the synthetic task mix, trainable on a laptop CPU.

Everyone that feeds the model a task (warm start, RL rollouts, validation) must
build the text with :func:`format_prompt` and stop at ``<eos>``; the model's
answer is the decoded text between the two.
"""

import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from .synthetic_tasks import (DOMAINS, MAX_ANSWER_CHARS, generate_split, score,
                                    with_demonstration_noise, write_jsonl)

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
    # The generation config inherits pad/bos/eos ids from the model config.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config).float()


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
def greedy_answers(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast,
                   prompts: Sequence[str], batch_size: int = 64,
                   max_new_tokens: int = MAX_ANSWER_CHARS + 1) -> list[str]:
    """Greedy answers to raw task prompts, decoded up to ``<eos>`` (batched, left-padded).

    Runs in the model's current train/eval mode; the tiny model has no dropout.
    """
    answers: list[str] = []
    for start in range(0, len(prompts), batch_size):
        enc = tokenizer([format_prompt(p) for p in prompts[start:start + batch_size]],
                        return_tensors='pt', padding=True)
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id)
        answers += tokenizer.batch_decode(out[:, enc['input_ids'].shape[1]:],
                                          skip_special_tokens=True)
    return answers


def greedy_accuracy(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast,
                    records: Sequence[dict], batch_size: int = 64,
                    max_new_tokens: int = MAX_ANSWER_CHARS + 1) -> dict[str, float]:
    """Exact-match accuracy of greedy answers per domain (domains in first-seen order)."""
    answers = greedy_answers(model, tokenizer, [r['prompt'] for r in records], batch_size,
                             max_new_tokens)
    hits: dict[str, list[float]] = {}
    for rec, text in zip(records, answers):
        hits.setdefault(rec['domain'], []).append(score(rec['domain'], text, rec['answer']))
    return {d: sum(v) / len(v) for d, v in hits.items()}


def load_tiny(model_dir: str | os.PathLike) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """Loads the model and tokenizer saved by :func:`warm_start` (offline, float32)."""
    model = Qwen2ForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    return model, PreTrainedTokenizerFast.from_pretrained(model_dir)


def read_warm_start_report(model_dir: str | os.PathLike) -> dict:
    """The ``warm_start.json`` next to a warm-started model (see :func:`warm_start`)."""
    return json.loads((Path(model_dir) / 'warm_start.json').read_text())


def _lr_factor(step: int, steps: int) -> float:
    """Linear warm-up over the first 5 % of steps, then cosine decay to zero."""
    warmup = max(1, steps // 20)
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def _train(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, records: list[dict], *,
           seed: int, steps: int, batch_size: int, lr: float,
           progress: Callable[[str], None] | None = None) -> float:
    """Teacher-forced AdamW pass over random batches of ``records``; returns the last loss.

    ``progress`` gets a line about every tenth of the steps (loss, elapsed time).
    """
    start, every = time.perf_counter(), max(1, steps // 10)
    gen = torch.Generator().manual_seed(seed)  # batches independent of the global RNG
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, steps))
    model.train()
    loss = torch.tensor(float('nan'))
    for step in range(steps):
        idx = torch.randint(len(records), (batch_size,), generator=gen).tolist()
        loss = model(**build_sft_batch(tokenizer, [records[i] for i in idx])).loss
        if not torch.isfinite(loss):
            # Refuse to save a diverged model that would otherwise look valid.
            raise FloatingPointError(f'warm start diverged at step {step} (loss {loss.item()})')
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if progress is not None and ((step + 1) % every == 0 or step + 1 == steps):
            progress(f'warm start: step {step + 1}/{steps}, loss {loss.item():.3f}, '
                     f'{time.perf_counter() - start:.0f} s')
    model.eval()
    return loss.item()


def _publish(tmp: Path, final: Path) -> None:
    """Moves the finished directory ``tmp`` to ``final``, replacing an older one."""
    # Directories cannot be os.replace'd onto non-empty ones: move the old one aside.
    old = Path(tempfile.mkdtemp(prefix='.model.old-', dir=final.parent))
    if final.exists():
        os.replace(final, old / 'model')
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def warm_start(out_dir: str | os.PathLike, *, seed: int = 0, steps: int = 800,
               batch_size: int = 64, lr: float = 3e-3, n_sft_per_domain: int = 2000,
               n_train_per_domain: int = 2000, n_val_per_domain: int = 200,
               noise: dict[str, float] | None = None, force: bool = False,
               progress: Callable[[str], None] | None = None) -> Path:
    """Builds the task files and a supervised warm-started tiny policy, cached on disk.

    Writes ``out_dir/data/{sft,train,val}.jsonl`` and ``out_dir/model/``: model, tokenizer
    and ``warm_start.json`` (``params``, greedy ``val_accuracy`` per domain,
    ``final_loss``, ``train_seconds``, ``trained_at`` as a Unix time). The defaults
    (~1.5 min on 2 CPU cores) leave partial competence that differs by domain:
    copy 0.965, add 0.32, sort 0.70, mul 0.225 (greedy, held-out prompts), so RL has
    headroom everywhere.

    Deterministic: the same arguments give bitwise identical weights on one machine
    (training runs on one thread, whatever the global torch setting).
    Cached: if ``model/warm_start.json`` holds the same parameters (and digest of the
    generated data) and ``force`` is false, nothing is retrained. Atomic: the model is
    written to a temporary directory that replaces ``model/`` only once complete, so a
    failed or interrupted run leaves either the previous model or no ``model/`` at all.

    Args:
        out_dir: output root.
        seed: seeds the task data, the initial weights and the batch order.
        steps: optimizer steps (AdamW, 5 % warm-up then cosine decay to zero).
        batch_size: records per step, drawn uniformly with replacement.
        lr: peak learning rate.
        n_sft_per_domain: warm-start records per domain (the ``sft`` split).
        n_train_per_domain: RL records per domain (the ``train`` split, prompts the
            warm start never saw).
        n_val_per_domain: val records per domain (for the reported accuracy).
        noise: domain -> share of its warm-start answers replaced by a systematic mistake
            (:func:`~gepo_xtuner.testbed.synthetic_tasks.with_demonstration_noise`);
            ``sft.jsonl`` holds the noisy answers, train and val stay clean. None: clean.
        force: retrain even if a cached model with these parameters exists.
        progress: called with one line per stage and about every tenth of the steps
            (e.g. ``print``); nothing is reported when the cache is used.

    Returns:
        The model directory ``out_dir/model`` (load it with :func:`load_tiny`).

    Raises:
        FloatingPointError: if the loss becomes non-finite (nothing is saved).
    """
    model_dir = Path(out_dir) / 'model'
    splits = {s: generate_split(s, n, seed)
              for s, n in (('sft', n_sft_per_domain), ('train', n_train_per_domain),
                           ('val', n_val_per_domain))}
    if noise:
        splits['sft'] = with_demonstration_noise(splits['sft'], noise, seed)
    # The data digest invalidates the cache when the task generators change.
    digest = hashlib.sha256(json.dumps(splits, sort_keys=True).encode()).hexdigest()[:16]
    params = dict(version=2, seed=seed, steps=steps, batch_size=batch_size, lr=lr,
                  n_sft_per_domain=n_sft_per_domain, n_train_per_domain=n_train_per_domain,
                  n_val_per_domain=n_val_per_domain, data_sha256=digest)
    if noise:  # absent when clean: caches written before the option stay valid
        params['noise'] = dict(sorted(noise.items()))
    cached = (model_dir / 'warm_start.json').exists() and not force
    cached = cached and read_warm_start_report(model_dir).get('params') == params
    for split, records in splits.items():
        path = Path(out_dir) / 'data' / f'{split}.jsonl'
        if not (cached and path.exists()):
            write_jsonl(records, path)
    if cached:
        return model_dir
    sft, val = splits['sft'], splits['val']

    start, was_deterministic = time.perf_counter(), torch.are_deterministic_algorithms_enabled()
    threads = torch.get_num_threads()
    # One thread: as fast for a model this small, bitwise results do not depend on the
    # core count, and busy-waiting OpenMP workers cannot stall on a loaded machine
    # (two threads on a shared 2-core box ran up to 20x slower).
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    tmp = Path(tempfile.mkdtemp(prefix='.model.tmp-', dir=model_dir.parent))
    try:
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(len(tokenizer), seed)
        if progress is not None:
            progress(f'warm start: {steps} supervised steps of {batch_size} records '
                     '(cached afterwards; progress every tenth)')
        loss = _train(model, tokenizer, sft, seed=seed, steps=steps, batch_size=batch_size,
                      lr=lr, progress=progress)
        if progress is not None:
            progress(f'warm start: greedy accuracy on {len(val)} val prompts')
        accuracy = greedy_accuracy(model, tokenizer, val)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        report = dict(params=params, val_accuracy={d: accuracy.get(d) for d in DOMAINS},
                      final_loss=loss, train_seconds=round(time.perf_counter() - start, 2),
                      trained_at=time.time())
        # Written last: a directory with this file is complete.
        (tmp / 'warm_start.json').write_text(json.dumps(report, indent=2) + '\n')
        _publish(tmp, model_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        torch.use_deterministic_algorithms(was_deterministic)
        torch.set_num_threads(threads)
    return model_dir
