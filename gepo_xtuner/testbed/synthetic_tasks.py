"""A synthetic multi-domain task mix with exactly verifiable answers.

Four domains whose difficulty and sampling entropy differ clearly for the tiny
character-level model after its default warm start (``gepo_xtuner.testbed.tiny``):

========  =====================  ===================  ================================
domain    prompt                 answer               difficulty
========  =====================  ===================  ================================
``copy``  ``copy:qkzdwe``        ``qkzdwe``           6-16 letters: easy, low entropy
``add``   ``47+8``               ``55``               0-99 plus 0-9: medium, carries
``sort``  ``sort:qkzdwe``        ``dekqwz``           6-10 letters: medium, counting
``mul``   ``7*23``               ``161``              0-9 times 0-99: hard, high entropy
========  =====================  ===================  ================================

Every record is ``{"id", "domain", "prompt", "answer"}``. The model sees the prompt
(formatted by :func:`gepo_xtuner.testbed.tiny.format_prompt`) and must produce the
answer; :func:`score` is the verifiable reward.
"""

import hashlib
import json
import os
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from string import ascii_lowercase, digits

DOMAINS: tuple[str, ...] = ('copy', 'add', 'sort', 'mul')
#: ``sft``: warm-start prompts; ``train``: RL prompts, never seen by the warm start;
#: ``val``: held out from both.
SPLITS: tuple[str, ...] = ('sft', 'train', 'val')
#: Every character a prompt or an answer can contain (the tokenizer covers more).
TASK_CHARS: str = digits + ascii_lowercase + '+*:'
#: Longest answer any domain produces (``copy`` of 16 letters).
MAX_ANSWER_CHARS: int = 16
# One prompt in VAL_BUCKETS belongs to val, which leaves every domain at least
# 205 distinct val prompts (add and mul, the smallest spaces, have 1000 each).
VAL_BUCKETS = 5
# Of the other prompts, RL_BUCKETS in SPLIT_BUCKETS are RL prompts (~300 distinct for
# add and mul) and the rest warm-start prompts (~500). RL prompts must be new to the
# policy: a supervised pass memorises its prompts (greedy train accuracy on add was
# 0.97 against 0.85 on val), and RL on memorised prompts has nothing left to learn.
RL_BUCKETS, SPLIT_BUCKETS = 3, 8


def _copy(rng: random.Random) -> tuple[str, str]:
    word = ''.join(rng.choice(ascii_lowercase) for _ in range(rng.randint(6, 16)))
    return f'copy:{word}', word


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 99), rng.randint(0, 9)
    return f'{a}+{b}', str(a + b)


def _sort(rng: random.Random) -> tuple[str, str]:
    seq = ''.join(rng.choice(ascii_lowercase) for _ in range(rng.randint(6, 10)))
    return f'sort:{seq}', ''.join(sorted(seq))


def _mul(rng: random.Random) -> tuple[str, str]:
    # Small factors (0, 1) and one-digit b keep a few easy prompts, so even the
    # hardest domain gives RL some reward signal early on.
    a, b = rng.randint(0, 9), rng.randint(0, 99)
    return f'{a}*{b}', str(a * b)


_MAKERS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    'copy': _copy, 'add': _add, 'sort': _sort, 'mul': _mul}


def make_record(domain: str, rng: random.Random) -> dict[str, str]:
    """Draws one problem of ``domain`` (without an ``id``; :func:`generate_split` adds it).

    Args:
        domain: one of :data:`DOMAINS`.
        rng: source of randomness; the record is a pure function of its state.

    Returns:
        ``{"domain", "prompt", "answer"}``.
    """
    if domain not in _MAKERS:
        raise ValueError(f'unknown domain {domain!r}; choose one of {DOMAINS}')
    prompt, answer = _MAKERS[domain](rng)
    return {'domain': domain, 'prompt': prompt, 'answer': answer}


def split_of(prompt: str) -> str:
    """The split a prompt belongs to, from a stable hash of its text (not of a seed).

    One prompt in five is ``val``; of the rest, three in eight are ``train`` (RL) and
    five in eight ``sft`` (warm start).
    """
    bucket = int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=8).digest(), 'big')
    if bucket % VAL_BUCKETS == 0:
        return 'val'
    return 'train' if (bucket // VAL_BUCKETS) % SPLIT_BUCKETS < RL_BUCKETS else 'sft'


def generate_split(split: str, n_per_domain: int, seed: int) -> list[dict[str, str]]:
    """Deterministic records of one split, ``n_per_domain`` of each domain.

    The splits are disjoint by construction: a prompt's split is a fixed hash of its
    text (:func:`split_of`), and each split only keeps the draws that hash to it. This
    holds for any pair of seeds, so a val set never leaks into a train set built with
    another seed. Val prompts are distinct (accuracy is over distinct problems); sft
    and train prompts are i.i.d. draws and may repeat (``add`` and ``mul`` have only
    ~500 sft and ~300 train prompts each).

    Args:
        split: ``'sft'`` (warm start), ``'train'`` (RL) or ``'val'``.
        n_per_domain: records per domain.
        seed: the records are a pure function of ``(split, n_per_domain, seed)``.

    Returns:
        Records ``{"id", "domain", "prompt", "answer"}``, domains in :data:`DOMAINS`
        order; ids look like ``val-add-00007``.
    """
    if split not in SPLITS:
        raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
    if n_per_domain < 0:
        raise ValueError(f'n_per_domain must be >= 0, got {n_per_domain}')
    records = []
    for domain in DOMAINS:
        # A string seed is hashed with SHA-512 by `random`, so it is stable across
        # processes (unlike hash()) and each (seed, split, domain) stream is separate.
        rng = random.Random(f'{seed}/{split}/{domain}')
        seen: set[str] = set()
        count, attempts = 0, 0
        while count < n_per_domain:
            attempts += 1
            if attempts > 100 * n_per_domain + 10_000:
                raise ValueError(f'cannot draw {n_per_domain} distinct {split} prompts '
                                 f'for domain {domain!r}')
            rec = make_record(domain, rng)
            if split_of(rec['prompt']) != split or (split == 'val' and rec['prompt'] in seen):
                continue
            seen.add(rec['prompt'])
            records.append({'id': f'{split}-{domain}-{count:05d}', **rec})
            count += 1
    return records


def with_demonstration_noise(records: list[dict[str, str]], noise: dict[str, float],
                             seed: int) -> list[dict[str, str]]:
    """Warm-start records of which a share per domain demonstrate a systematic mistake.

    A noisy record's ``answer`` is the true answer reversed (``"161"`` -> ``"161"[::-1]``,
    ``"dekqwz"`` -> ``"zwqked"``): a consistent wrong habit, as imperfect demonstrations
    teach one, that a policy trained on them samples at about the noise rate and that a
    verifiable reward (scored against the true answer) can train away. Answers that read the
    same reversed (one digit, palindromes) stay correct.

    Args:
        records: records of :func:`generate_split` (not modified).
        noise: domain -> share in ``[0, 1]`` of its records to corrupt; other domains
            stay clean.
        seed: which records are corrupted is a pure function of ``(seed, record id)``.

    Returns:
        New records, in the same order.
    """
    for domain, share in noise.items():
        if domain not in DOMAINS or not 0.0 <= share <= 1.0:
            raise ValueError(f'noise must map domains of {DOMAINS} to shares in [0, 1], '
                             f'got {domain!r}: {share!r}')
    out = []
    for rec in records:
        rng = random.Random(f'{seed}/noise/{rec["id"]}')
        flip = rng.random() < noise.get(rec['domain'], 0.0)
        out.append({**rec, 'answer': rec['answer'][::-1]} if flip else dict(rec))
    return out


def write_jsonl(records: Iterable[dict], path: str | os.PathLike) -> Path:
    """Writes one JSON object per line, atomically (temp file, then ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f'.{path.name}.tmp-{os.getpid()}')
    try:
        with open(tmp, 'w', encoding='utf-8') as f:
            for rec in records:
                f.write(json.dumps(rec, ensure_ascii=False) + '\n')
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Reads the records written by :func:`write_jsonl` (blank lines are skipped)."""
    with open(path, encoding='utf-8') as f:
        return [json.loads(line) for line in f if line.strip()]


def build_task_files(out_dir: str | os.PathLike, n_train_per_domain: int,
                     n_val_per_domain: int, seed: int) -> dict[str, Path]:
    """Writes ``train.jsonl`` (RL prompts) and ``val.jsonl`` of the task mix into ``out_dir``.

    Returns:
        ``{"train": path, "val": path}``.
    """
    out_dir = Path(out_dir)
    return {
        'train': write_jsonl(generate_split('train', n_train_per_domain, seed),
                             out_dir / 'train.jsonl'),
        'val': write_jsonl(generate_split('val', n_val_per_domain, seed), out_dir / 'val.jsonl'),
    }


def score(domain: str, completion: str, answer: str) -> float:
    """Verifiable reward: exact match of the stripped completion with the answer.

    ``domain`` is unused for now; it keeps room for per-domain scoring rules.

    >>> score('add', ' 132\\n', '132')
    1.0
    >>> score('add', '131', '132')
    0.0
    """
    del domain
    return 1.0 if completion.strip() == answer else 0.0
