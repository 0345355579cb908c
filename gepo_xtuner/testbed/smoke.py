"""Smoke runs of RL configs on CPU: a tiny random policy, a small record set, scaled batches.

``tools/check_config.py CONFIG --smoke-steps N`` uses these pieces to run N real RL
steps of any config through XTuner's training entry point without weights or data:

* :func:`choose_family` / :func:`build_smoke_model`: a tiny randomly initialised model of
  the config's architecture family (``policy_model_type``), with a small local
  tokenizer (:func:`build_smoke_tokenizer`) and *peaked* output distributions, so that
  sampled-token log-probabilities vary by several nats (Clip-Cov's and KL-Cov's
  covariance ``(A - mean A)(logp - mean logp)`` then reaches the configured bounds);
* :func:`make_records` / :func:`calibrate_records`: prompt records for exactly the reward
  domains of ``train_cfg.rewards`` over the tokenizer's small vocabulary, with references
  chosen so that the tiny policy's own samples get mixed rewards from the config's real
  verifiers (mixed rewards inside a group give non-zero group-relative advantages);
* :func:`scale_geometry` / :func:`smoke_config`: the config with batch sizes scaled down
  but its structure kept (K responses per prompt, optimizer steps per rollout batch,
  several micro-batches per minibatch, P ranks, the same advantage, loss, hooks and
  reward routing), the rollout backend swapped for the in-process ``HFRolloutBackend``
  (LMDeploy needs a GPU), gloo process groups and float32 weights;
* :func:`prepare_smoke_run` writes all of it; :func:`train_command` is the launch;
  :func:`step_metrics` reads the logged metrics per step of a finished run.

Everything here is a function of its arguments (seeded), apart from :func:`prepare_smoke_run`,
which writes files.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import math
import os
import random
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    'ANSWER_TOKENS', 'IMAGE_PLACEHOLDER', 'IMAGE_TOKENS', 'OUTPUT_TOKENS', 'REWARD_KINDS',
    'SmokeGeometry', 'SmokePlan', 'TinyFamily', 'add_images', 'answer_candidates',
    'build_smoke_model', 'build_smoke_tokenizer', 'calibrate_records', 'choose_family',
    'domains_of', 'make_records', 'micro_batch_interface', 'prepare_smoke_run', 'reward_kind',
    'sample_completions', 'scale_geometry', 'smoke_config', 'step_metrics', 'train_command'
]

# ---------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------

SPECIAL_TOKENS: tuple[str, ...] = ('<pad>', '<bos>', '<eos>', '<unk>')
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
#: Everything the policy can write besides ``<eos>``: digits, option letters, a few symbols
#: and one phrase token. Prompts are written in the same characters, so no probability
#: mass sits on tokens that only prompts use, and every verifier's answer format is a
#: few tokens away: a digit (math, physics, chart, exact match), ``Answer: C`` or a first
#: line ``C`` (multiple choice), a comma-free short text (instruction following), a
#: one-token Python expression (code).
OUTPUT_TOKENS: tuple[str, ...] = ('1', '2', ' ', '\n', 'A', 'B', ',', '.', '+', '-', '=', '?', ':',
                                  'Answer: ')
#: Tokens whose LM-head rows :func:`build_smoke_model` scales up: the answers.
ANSWER_TOKENS: tuple[str, ...] = ('1', '2', 'A', 'B')
#: Characters a prompt may use (each is one token).
PROMPT_CHARS: frozenset[str] = frozenset(t for t in OUTPUT_TOKENS if len(t) == 1)


#: Intern-S1's image tokens (start, end, context, video), appended to the vocabulary of a
#: vision-language smoke tokenizer: ``<IMG_CONTEXT>`` once per image in a prompt, which
#: the processor expands to ``<img>`` + ``<IMG_CONTEXT>`` x (tokens per tile x tiles) +
#: ``</img>``.
IMAGE_TOKENS: tuple[str, ...] = ('<img>', '</img>', '<IMG_CONTEXT>', '<video>')
IMAGE_PLACEHOLDER = '<IMG_CONTEXT>'


def build_smoke_tokenizer(model_max_length: int = 256, vision: bool = False):
    """A word-level tokenizer over :data:`SPECIAL_TOKENS` + :data:`OUTPUT_TOKENS`.

    Text is split into single characters (each in the vocabulary); the phrase token
    ``'Answer: '`` is never produced by encoding, only by the model. Decoding joins
    tokens without separators. Left padding, as batched generation needs.

    Args:
        model_max_length: the tokenizer's maximum sequence length.
        vision: also :data:`IMAGE_TOKENS` (after every other id, so the text ids are the
            same), as the tokenizer's ``start_image_token`` / ``end_image_token`` /
            ``context_image_token`` / ``video_token`` (what ``InternVLProcessor`` reads).

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` built locally (nothing downloaded).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokens = SPECIAL_TOKENS + OUTPUT_TOKENS + (IMAGE_TOKENS if vision else ())
    vocab = {tok: i for i, tok in enumerate(tokens)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token='<unk>'))
    core.pre_tokenizer = pre_tokenizers.Split(Regex('[\\s\\S]'), behavior='isolated')
    core.post_processor = processors.TemplateProcessing(
        single='<bos> $A', pair='<bos> $A $B:1', special_tokens=[('<bos>', BOS_ID)])
    core.decoder = decoders.Fuse()
    extra: dict[str, Any] = {}
    if vision:
        core.add_special_tokens(list(IMAGE_TOKENS))  # matched whole, before the split
        extra = dict(additional_special_tokens=list(IMAGE_TOKENS), extra_special_tokens=dict(
            zip(('start_image_token', 'end_image_token', 'context_image_token', 'video_token'),
                IMAGE_TOKENS)))
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token='<pad>', bos_token='<bos>', eos_token='<eos>',
        unk_token='<unk>', padding_side='left', clean_up_tokenization_spaces=False,
        model_max_length=model_max_length, model_input_names=['input_ids', 'attention_mask'],
        **extra)


# ---------------------------------------------------------------------------------------
# tiny model
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TinyFamily:
    """The architecture a smoke run uses in place of the config's model.

    Attributes:
        name: ``'qwen3'``, ``'qwen2'`` or ``'internvl'`` (a vision-language model:
            InternViT + Qwen3, Intern-S1's layout; :mod:`~gepo_xtuner.testbed.tiny_interns1`).
        model_class: the ``transformers`` model class name.
        config_class: its config class name.
        reason: one sentence on why this family stands in for the config's model.
    """

    name: str
    model_class: str
    config_class: str
    reason: str

    @property
    def vision(self) -> bool:
        """A vision-language model: the smoke records then carry images."""
        return self.name == 'internvl'


#: policy_model_type -> (what its language model is, the family that stands in for it)
_LANGUAGE_MODELS: dict[str, str] = {
    'interns1': "Intern-S1-mini's language model is Qwen3 (its InternViT tower is not "
                'exercised by text records)',
    'qwen3_5': "Qwen3.5 is a Qwen3-lineage decoder (its hybrid attention and the "
               'transformers 5 class are not exercised)',
    'qwen3': 'the config names Qwen3 itself',
    'qwen2': 'the config names Qwen2 itself',
}


#: policy_model_type -> why the tiny Intern-S1-shaped VLM stands in for it
VISION_TYPES: dict[str, str] = {
    'interns1': 'Intern-S1-mini is InternViT + a pixel-shuffle projector + Qwen3: a tiny VLM of '
                'that layout (native InternVL classes, image tiles, <img>/<IMG_CONTEXT> '
                'expansion) trains on image and text records',
}


def choose_family(policy_model_type: str | None) -> TinyFamily:
    """The tiny family standing in for a config's ``policy_model_type``.

    For Intern-S1 (``interns1``) the tiny Intern-S1-shaped VLM where the installed
    ``transformers`` has the ``internvl`` classes (4.52 and later; in this repository the
    transformers-5 overlay), else its language model alone. Otherwise Qwen3 when the
    installed ``transformers`` has ``Qwen3ForCausalLM`` (4.51 and later), else Qwen2, its
    predecessor (same decoder layout, no q/k norms); configs without a
    ``policy_model_type`` (the tiny CPU configs, whose policy is a Qwen2) get Qwen2.

    Args:
        policy_model_type: the config's ``policy_model_type`` (``'interns1'``,
            ``'qwen3_5'``, ...) or None.

    Returns:
        The family and the reason, to be shown to the user.
    """
    import transformers

    have_qwen3 = hasattr(transformers, 'Qwen3ForCausalLM')
    if policy_model_type in VISION_TYPES:
        if hasattr(transformers, 'InternVLForConditionalGeneration'):
            return TinyFamily('internvl', 'InternVLForConditionalGeneration', 'InternVLConfig',
                              VISION_TYPES[policy_model_type])
        why = (f'{_LANGUAGE_MODELS[policy_model_type]}; the Intern-S1-shaped VLM needs the '
               f'internvl classes (transformers >= 4.52), and transformers '
               f'{transformers.__version__} has none, so text records only (run with the '
               'transformers-5 overlay for images: docs/transformers5.md)')
        if have_qwen3:
            return TinyFamily('qwen3', 'Qwen3ForCausalLM', 'Qwen3Config', why)
        return TinyFamily('qwen2', 'Qwen2ForCausalLM', 'Qwen2Config',
                          f'{why}; it has no Qwen3ForCausalLM either, so its predecessor Qwen2 '
                          'is used')
    if policy_model_type is None:
        return TinyFamily('qwen2', 'Qwen2ForCausalLM', 'Qwen2Config',
                          'the config sets no policy_model_type; its tiny CPU policy is a Qwen2')
    why = _LANGUAGE_MODELS.get(policy_model_type,
                               f'{policy_model_type!r} has no known tiny stand-in; a Qwen-family '
                               'decoder is used')
    if policy_model_type == 'qwen2':
        return TinyFamily('qwen2', 'Qwen2ForCausalLM', 'Qwen2Config', why)
    if have_qwen3:
        return TinyFamily('qwen3', 'Qwen3ForCausalLM', 'Qwen3Config', why)
    return TinyFamily('qwen2', 'Qwen2ForCausalLM', 'Qwen2Config',
                      f'{why}; the installed transformers {transformers.__version__} has no '
                      'Qwen3ForCausalLM, so its predecessor Qwen2 is used')


def build_smoke_model(family: TinyFamily, vocab_size: int, seed: int = 0,
                      logit_std: float = 3.0, eos_scale: float = 2.5,
                      answer_scale: float = 2.0, image_token_id: int | None = None):
    """A tiny float32 decoder of ``family`` with peaked next-token distributions.

    Layers are initialised as ``transformers`` does; the (untied) LM head is then
    redrawn so that logits have standard deviation about ``logit_std`` (the final
    RMSNorm leaves hidden entries of size about 1): a random model's next-token
    distribution then has a clear favourite, and the log-probabilities of sampled
    tokens spread over several nats instead of all sitting near ``-log(vocab_size)``.
    The ``<eos>`` row is scaled by ``eos_scale``, so responses end early about as often
    as they run to the token limit, and the rows of :data:`ANSWER_TOKENS` by
    ``answer_scale``, so that answers are written often enough to be right sometimes.

    Args:
        family: from :func:`choose_family`.
        vocab_size: rows of embedding and LM head (``len(tokenizer)``).
        seed: the weights are a function of the seed and these arguments; the global
            torch RNG is left untouched.
        logit_std: target standard deviation of the logits.
        eos_scale: factor on the ``<eos>`` row of the LM head.
        answer_scale: factor on the rows of :data:`ANSWER_TOKENS`.
        image_token_id: for a vision family, the id of :data:`IMAGE_PLACEHOLDER`. Its
            vision tower is :mod:`~gepo_xtuner.testbed.tiny_interns1`'s (InternViT, 1
            layer of width 32, 56-pixel tiles, 4 image tokens per tile); its language
            model is the Qwen3 decoder below.

    Returns:
        The model (``transformers.PreTrainedModel``), in eval mode.
    """
    import torch
    import transformers

    hidden = 64
    cfg = dict(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
               max_position_embeddings=512, tie_word_embeddings=False, attention_dropout=0.0,
               rope_theta=10_000.0, pad_token_id=PAD_ID, bos_token_id=BOS_ID,
               eos_token_id=EOS_ID, torch_dtype='float32', use_cache=True)
    if family.name in ('qwen3', 'internvl'):
        cfg['head_dim'] = hidden // 4
    if family.vision:
        from .tiny_interns1 import internvl_config
        if image_token_id is None:
            raise ValueError('a vision family needs image_token_id (the <IMG_CONTEXT> id)')
        config = internvl_config(transformers.Qwen3Config(**cfg), image_token_id)
    else:
        config = getattr(transformers, family.config_class)(**cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, family.model_class)(config).float()
        with torch.no_grad():
            head = model.lm_head.weight
            head.normal_(0.0, logit_std / math.sqrt(hidden))
            head[EOS_ID] *= eos_scale
            for token in ANSWER_TOKENS:
                head[len(SPECIAL_TOKENS) + OUTPUT_TOKENS.index(token)] *= answer_scale
    return model.eval()


# ---------------------------------------------------------------------------------------
# records
# ---------------------------------------------------------------------------------------

#: Reward type -> the record format made for it.
REWARD_KINDS: dict[str, str] = {
    'MathReward': 'math',
    'NumericReward': 'physics',
    'MultipleChoiceReward': 'science',
    'CodeReward': 'code',
    'InstructionFollowingReward': 'instruction',
    'ChartQAReward': 'chart',
    'ExactMatchReward': 'exact',
}


def reward_kind(reward_cfg: Any) -> str:
    """The record format for a reward config (``'exact'`` for unknown types).

    Args:
        reward_cfg: one value of ``train_cfg.rewards``: ``dict(type=...)`` or a callable.

    Returns:
        A key of :func:`make_records`'s formats: one of :data:`REWARD_KINDS`' values.
        Unknown reward types get ``'exact'`` records (a one-digit ``answer``), which
        any answer-checking reward can read.
    """
    kind = reward_cfg.get('type') if isinstance(reward_cfg, Mapping) else reward_cfg
    name = kind if isinstance(kind, str) else getattr(kind, '__name__', type(kind).__name__)
    return REWARD_KINDS.get(name, 'exact')


def _digits(rng: random.Random, n: int) -> str:
    return ''.join(rng.choice('12') for _ in range(n))


_SUMS = (('1+1', 2), ('2-1', 1), ('1+1-1', 1), ('2+1-1', 2), ('1-1+1', 1), ('2-1+1', 2))


def _record(kind: str, domain: str, index: int, rng: random.Random) -> dict[str, Any]:
    """One record of format ``kind`` for ``domain`` (prompt in :data:`PROMPT_CHARS`).

    Answers are ``1`` or ``2`` (``A`` or ``B``): the digits and letters the policy can
    write, so a random policy is right about as often as it states an answer at all.
    """
    tag = f'{_digits(rng, 3)}:'
    if kind in ('math', 'physics'):
        expr, value = rng.choice(_SUMS)
        rec = dict(prompt=f'{tag}{expr}=?', answer=str(value))
        if kind == 'physics':
            rec['unit'] = 'm'  # a bare number is read in the reference's unit
    elif kind == 'science':
        rec = dict(prompt=f'{tag}A 1 B 2?', choices=['1', '2'], answer=rng.choice('AB'))
    elif kind == 'code':
        # a program that prints nothing passes: a one-token expression such as `1` does,
        # `1 A` (a syntax error) or `A` (a name error) does not
        rec = dict(prompt=f'{tag}?', tests=[dict(input='', output='')])
    elif kind == 'instruction':
        rec = dict(prompt=f'{tag}. .', instructions=[
            dict(id='punctuation:no_comma', kwargs={}),
            dict(id='length_constraints:number_words',
                 kwargs=dict(num_words=3, relation='less than'))])
    elif kind == 'chart':
        vals = [rng.choice('12') for _ in range(3)]
        rec = dict(prompt=f'{tag}{" ".join(vals)}?', answer=max(vals))
    elif kind == 'exact':
        rec = dict(prompt=f'{tag}{_digits(rng, 2)}', answer=rng.choice('12'))
    else:
        raise ValueError(f'unknown record format {kind!r}; known: '
                         f'{sorted(set(REWARD_KINDS.values()))}')
    assert set(rec['prompt']) <= PROMPT_CHARS, rec['prompt']
    return dict(id=f'{domain}-{index}', domain=domain, **rec)


def make_records(domains: Mapping[str, str], n_per_domain: int,
                 seed: int = 0) -> list[dict[str, Any]]:
    """``n_per_domain`` records for each domain, in the format of its reward.

    Args:
        domains: domain name -> record format (see :func:`reward_kind`). A domain named
            ``'default'`` (the router's fallback key) gets records with that domain,
            which the router sends to ``rewards['default']``.
        n_per_domain: records per domain.
        seed: the records are a function of the seed and the arguments.

    Returns:
        Records valid under :mod:`gepo_xtuner.data.records`' schema, domains interleaved.
    """
    rng = random.Random(seed)
    per_domain = [[_record(kind, domain, i, rng) for i in range(n_per_domain)]
                  for domain, kind in domains.items()]
    return [rec for group in zip(*per_domain) for rec in group]


#: picture sizes (width, height) of smoke images, in turn: 1, 3 and 5 tiles of the tiny VLM
IMAGE_SIZES: tuple[tuple[int, int], ...] = ((56, 56), (112, 56), (112, 112))


def add_images(records: Sequence[dict[str, Any]], data_dir: str | Path, split: str,
               every: int = 2) -> list[dict[str, Any]]:
    """Records with a picture on every ``every``-th one (from the first), for a VLM smoke run.

    The picture (squares of a colour, :data:`IMAGE_SIZES` in turn, so prompts carry 1, 3 or
    5 tiles) is written to ``data_dir/images/<split>-<id>.png`` and named relative to the
    data files, as records name their images; :data:`IMAGE_PLACEHOLDER` opens the prompt.
    The others stay text-only, so batches mix both.

    Args:
        records: from :func:`make_records`; not modified.
        data_dir: the directory of the JSONL files.
        split: ``'train'`` or ``'val'`` (keeps the two splits' files apart).
        every: one record in ``every`` gets a picture.
    """
    from .tiny_vl import COLOURS, draw_squares

    out = []
    colours = sorted(COLOURS)
    for i, record in enumerate(records):
        record = dict(record)
        if i % every == 0:
            name = f'images/{split}-{record["id"]}.png'
            size = IMAGE_SIZES[(i // every) % len(IMAGE_SIZES)]
            draw_squares(Path(data_dir) / name, colours[i % len(colours)], 1 + i % 2, size=size)
            record.update(images=[name], prompt=IMAGE_PLACEHOLDER + record['prompt'])
        out.append(record)
    return out


def _with_paths(record: Mapping[str, Any], root: Path | None) -> dict[str, Any]:
    """``record`` with its images as paths under ``root`` (as the dataset resolves them)."""
    if not record.get('images') or root is None:
        return dict(record)
    return dict(record, images=[str(root / p) for p in record['images']])


def sample_completions(model: Any, tokenizer: Any, records: Sequence[dict[str, Any]], k: int,
                       *, template: str = '{prompt}', temperature: float = 1.0,
                       top_p: float = 1.0, top_k: int = 0, max_new_tokens: int = 12,
                       seed: int = 0, batch_size: int = 512, processor: Any = None,
                       image_root: str | Path | None = None) -> list[list[str]]:
    """``k`` sampled completions per record, decoded without special tokens.

    Prompts are encoded as the RL loop encodes them
    (:func:`~gepo_xtuner.data.prompts.encode_prompt` with ``template``); sampling
    stops at the tokenizer's EOS.

    Args:
        model: a ``transformers`` causal LM.
        tokenizer: its tokenizer (left padding).
        records: prompt records.
        k: completions per record.
        template: the config's ``prompt_template``.
        temperature, top_p, top_k: sampling parameters (``top_k=0``: off).
        max_new_tokens: response token limit.
        seed: sampling seed (the global torch RNG is restored afterwards).
        batch_size: sequences per ``generate`` call.
        processor: a VLM's processor, for records with images (encoded as the RL loop
            encodes them, :func:`~gepo_xtuner.engine.step.prompt_encoding.encode_request`;
            each such record is one ``generate`` call of its ``k`` rows).
        image_root: the directory the records' image paths are relative to.

    Returns:
        One list of ``k`` strings per record, in order.
    """
    import torch

    from ..data.prompts import encode_prompt

    root = None if image_root is None else Path(image_root)
    pictured = {i for i, r in enumerate(records) if r.get('images')}
    ids = [encode_prompt(tokenizer, r, template) for i, r in enumerate(records)
           if i not in pictured]
    rows = [p for p in ids for _ in range(k)]
    texts: list[str] = []
    by_record: dict[int, list[str]] = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        if pictured:
            from ..engine.step.prompt_encoding import encode_request
        for i in sorted(pictured):
            request = encode_request(_with_paths(records[i], root), tokenizer, processor,
                                     template)
            prompt = torch.tensor([request.prompt_ids] * k)
            mm = {key: torch.cat([value] * k) for key, value in request.mm_inputs.items()}
            out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), **mm,
                                 do_sample=True, temperature=temperature, top_p=top_p,
                                 top_k=top_k, max_new_tokens=max_new_tokens,
                                 pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
            by_record[i] = tokenizer.batch_decode(out[:, prompt.shape[1]:],
                                                  skip_special_tokens=True)
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            width = max(map(len, chunk))
            input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r
                                      for r in chunk])
            out = model.generate(input_ids=input_ids,
                                 attention_mask=(input_ids != tokenizer.pad_token_id).long(),
                                 do_sample=True, temperature=temperature, top_p=top_p,
                                 top_k=top_k, max_new_tokens=max_new_tokens,
                                 pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
            texts += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    plain = iter(range(len(records) - len(pictured)))
    return [by_record[i] if i in pictured else texts[(j := next(plain)) * k:(j + 1) * k]
            for i in range(len(records))]


_NUMBER = re.compile(r'[-+]?\d+(?:\.\d+)?')


def _frequent(values: Iterable[str], limit: int) -> list[str]:
    counts: dict[str, int] = {}
    for v in values:
        if v:
            counts[v] = counts.get(v, 0) + 1
    return sorted(counts, key=lambda v: -counts[v])[:limit]


def answer_candidates(kind: str, record: Mapping[str, Any], completions: Sequence[str],
                      limit: int = 4) -> list[dict[str, Any]]:
    """Field updates to try on a record so that ``completions`` get mixed rewards.

    Args:
        kind: the record format (:func:`reward_kind`).
        record: the draft record.
        completions: the policy's sampled completions for it.
        limit: most candidates taken from the completions.

    Returns:
        Updates (e.g. ``{'answer': '12'}``), the record's own values first.
    """
    if kind in ('math', 'physics'):  # numbers the completions state
        found = [m[-1] for m in (_NUMBER.findall(c) for c in completions) if m]
        return [{'answer': a} for a in _frequent([record['answer'], *found], limit + 1)]
    if kind in ('chart', 'exact'):  # whole stripped completions, last lines
        lines = [c.strip().splitlines()[-1].strip() if c.strip() else '' for c in completions]
        found = [c.strip() for c in completions] if kind == 'exact' else lines
        return [{'answer': a} for a in _frequent([str(record['answer']), *found], limit + 1)]
    if kind == 'science':
        return [{'answer': letter} for letter in 'AB']
    if kind == 'instruction':
        first = dict(id='punctuation:no_comma', kwargs={})
        return [{'instructions': [first, dict(id='length_constraints:number_words',
                                              kwargs=dict(num_words=n, relation='less than'))]}
                for n in range(1, 13)]
    return [{}]


def calibrate_records(records: Sequence[dict[str, Any]], kinds: Mapping[str, str],
                      completions: Sequence[Sequence[str]], reward_for: Any,
                      keep: int | None = None
                      ) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    """Picks each record's reference so that the policy's own samples get mixed rewards.

    For every record, each update of :func:`answer_candidates` is scored with the real
    reward function on the record's sampled completions; the one whose reward rate is
    closest to 1/2 (strictly between 0 and 1) is applied. A record no candidate mixes
    keeps its draft reference. A reward function that raises scores 0, as in training.
    With ``keep``, only the ``keep`` records per domain whose rates are closest to 1/2
    are returned (in their original order): draft more records than needed, so that
    rates of a single lucky sample (1/16) do not make the set.

    Args:
        records: draft records (:func:`make_records`); not modified.
        kinds: domain -> record format.
        completions: per record, the sampled completions (:func:`sample_completions`).
        reward_for: ``domain -> fn(completion, record) -> float``
            (e.g. ``RewardRouter(...).fn_for``).
        keep: records to keep per domain (default: all).

    Returns:
        ``(records, report)``; ``report[domain]`` holds ``reward_rate`` (the mean reward
        of the samples under the chosen references) and ``mixed_groups`` (the share of
        records whose samples got mixed rewards).
    """
    scored: list[tuple[float, dict[str, Any], float]] = []
    for record, texts in zip(records, completions, strict=True):
        domain = record['domain']
        fn = reward_for(domain)
        best: tuple[float, dict[str, Any], float] | None = None
        for update in answer_candidates(kinds.get(domain, 'exact'), record, texts):
            trial = {**record, **update}
            rate = sum(v > 0 for v in _safe_rewards(fn, texts, trial)) / max(len(texts), 1)
            score = abs(rate - 0.5) if 0 < rate < 1 else 2.0 + abs(rate - 0.5)
            if best is None or score < best[0]:
                best = (score, update, rate)
        assert best is not None
        scored.append((best[0], {**record, **best[1]}, best[2]))
    chosen: set[int] = set()
    for domain in dict.fromkeys(r['domain'] for r in records):
        mine = [i for i, r in enumerate(records) if r['domain'] == domain]
        mine.sort(key=lambda i: scored[i][0])  # stable: ties keep the draft order
        chosen.update(mine[:keep] if keep is not None else mine)
    out: list[dict[str, Any]] = []
    stats: dict[str, list[tuple[float, bool]]] = {}
    for i, (_, record, rate) in enumerate(scored):
        if i in chosen:
            out.append(record)
            stats.setdefault(record['domain'], []).append((rate, 0 < rate < 1))
    report = {d: dict(reward_rate=sum(r for r, _ in v) / len(v),
                      mixed_groups=sum(m for _, m in v) / len(v)) for d, v in stats.items()}
    return out, report


def _safe_rewards(fn: Any, texts: Sequence[str], record: Mapping[str, Any]) -> list[float]:
    """The reward of each of ``texts`` for ``record``, as training scores them: through the
    reward's own :meth:`~gepo_xtuner.reward.base.Reward.score_batch` where it has one (the
    code reward's runs in parallel), one by one where that raises or gives no finite
    number, and 0 for a sample whose reward raises."""
    from ..reward.base import scores_in_batches
    if scores_in_batches(fn):
        try:
            values = [float(v) for v in fn.score_batch(list(texts),
                                                       [dict(record) for _ in texts])]
        except Exception:  # noqa: BLE001 (scored one by one below, as the router does)
            values = []
        if len(values) == len(texts) and all(math.isfinite(v) for v in values):
            return values
    return [_safe_reward(fn, t, record) for t in texts]


def _safe_reward(fn: Any, completion: str, record: Mapping[str, Any]) -> float:
    try:
        value = float(fn(completion, dict(record)))
    except Exception:  # noqa: BLE001 (the router scores a failing verifier 0 too)
        return 0.0
    return value if math.isfinite(value) else 0.0


# ---------------------------------------------------------------------------------------
# batch geometry
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SmokeGeometry:
    """Batch sizes of a smoke run and of the config it stands for.

    Attributes:
        num_responses: K, as in the config.
        world_size: P, training processes.
        minibatches_per_step: optimizer steps per rollout batch and PPO epoch, as in
            the config.
        prompts_per_rank: prompts each rank draws per RL step.
        minibatch_responses_per_rank: responses per optimizer step and rank.
        micro_batches: target forward/backward micro-batches per minibatch and rank.
        micro_batch_size: responses per micro-batch (fixed-size interface).
        max_tokens_per_micro_batch: padded-token budget per micro-batch
            (token-budget interface): about ``minibatch_responses_per_rank * row_tokens /
            micro_batches``.
        row_tokens: the padded row width assumed (prompt + ``max_new_tokens``).
        config: the same quantities of the original config (``prompts_per_step``
            over all ranks, ``minibatch_responses`` over all ranks, ...).
    """

    num_responses: int
    world_size: int
    minibatches_per_step: int
    prompts_per_rank: int
    minibatch_responses_per_rank: int
    micro_batches: int
    micro_batch_size: int
    max_tokens_per_micro_batch: int
    row_tokens: int
    config: dict[str, int]

    @property
    def prompts_per_step(self) -> int:
        """Prompts per RL step over all ranks."""
        return self.prompts_per_rank * self.world_size

    def as_dict(self) -> dict[str, Any]:
        """The fields and ``prompts_per_step``, for printing."""
        return dict(asdict(self), prompts_per_step=self.prompts_per_step)


def scale_geometry(num_responses: int, prompts_per_step: int, minibatch_responses: int,
                   world_size: int, row_tokens: int, min_minibatch_per_rank: int = 16,
                   micro_batches: float = 3.5) -> SmokeGeometry:
    """Scales a config's batch down, keeping its structure.

    Kept: K, the number of minibatches (optimizer steps) per rollout batch, the world
    size. The global minibatch becomes the fewest whole prompts (m x K responses) that
    split evenly over the ranks with at least ``min_minibatch_per_rank`` responses per
    rank (or K when that is fewer); the rollout batch is ``minibatches_per_step``
    minibatches. Each minibatch is cut into about ``micro_batches`` micro-batches.

    Args:
        num_responses: the config's K.
        prompts_per_step: the config's prompts per RL step, all ranks.
        minibatch_responses: the config's responses per optimizer step, all ranks.
        world_size: P for the smoke run.
        row_tokens: padded tokens of one response row (prompt + max new tokens).
        min_minibatch_per_rank: smallest per-rank minibatch wanted (responses).
        micro_batches: micro-batches per minibatch wanted (token budget).

    Returns:
        The geometry.

    Raises:
        ValueError: if the config's minibatch does not divide its rollout batch, or an
            argument is not positive.
    """
    k, p = num_responses, world_size
    if min(k, prompts_per_step, minibatch_responses, p, row_tokens) < 1 or micro_batches < 1:
        raise ValueError('num_responses, prompts_per_step, minibatch_responses, world_size, '
                         'row_tokens and micro_batches must be positive')
    responses = prompts_per_step * k
    if responses % minibatch_responses:
        raise ValueError(f'the config\'s minibatch ({minibatch_responses} responses) does not '
                         f'divide its rollout batch ({responses} responses)')
    n_mb = responses // minibatch_responses
    want = min(min_minibatch_per_rank, k)
    m = 1  # minibatch prompts, all ranks
    while (m * k) % p or (m * n_mb) % p or m * k // p < want:
        m += 1
    minibatch = m * k // p
    micro = max(1, round(minibatch / micro_batches))
    while minibatch % micro:
        micro -= 1
    budget = max(row_tokens, math.ceil(minibatch * row_tokens / micro_batches))
    return SmokeGeometry(
        num_responses=k, world_size=p, minibatches_per_step=n_mb,
        prompts_per_rank=m * n_mb // p, minibatch_responses_per_rank=minibatch,
        micro_batches=minibatch // micro, micro_batch_size=micro,
        max_tokens_per_micro_batch=budget, row_tokens=row_tokens,
        config=dict(prompts_per_step=prompts_per_step, minibatch_responses=minibatch_responses,
                    minibatches_per_step=n_mb))


# ---------------------------------------------------------------------------------------
# the smoke config
# ---------------------------------------------------------------------------------------


def micro_batch_interface(loop_cls: type) -> str:
    """``'tokens'`` if the RL loop takes ``max_tokens_per_micro_batch``, else ``'rows'``.

    Args:
        loop_cls: the ``RLTrainLoop`` class.
    """
    keys = (loop_cls.train_cfg_keys() if hasattr(loop_cls, 'train_cfg_keys')
            else inspect.signature(loop_cls).parameters)  # a loop taking its keys as arguments
    return 'tokens' if 'max_tokens_per_micro_batch' in keys else 'rows'


def smoke_config(cfg: Mapping[str, Any], *, model_dir: str, data_dir: str, steps: int,
                 geometry: SmokeGeometry, interface: str, max_new_tokens: int,
                 model_class: str | None = None) -> dict[str, Any]:
    """The config of a smoke run: ``cfg`` with model, data, batches and runtime replaced.

    Replaced: the model directory (``model.pretrained``; float32, the standard causal-LM
    class, no custom code), the train and validation files, per-rank batch sizes and
    micro-batching (:class:`SmokeGeometry`), the rollout backend (``HFRolloutBackend``:
    LMDeploy needs a GPU), ``max_new_tokens``, the step count, validation and
    checkpoint intervals (= ``steps``), gloo process groups and DDP without device ids.
    Kept: K, sampling temperature / top-p / top-k, advantage, policy loss, rewards and
    their routing, prompt template, PPO epochs, optimizer, hooks, log processor.

    Args:
        cfg: the loaded config (an ``mmengine.Config`` or a plain dict); not modified.
        model_dir: tiny model directory (:func:`write_smoke_model`).
        data_dir: directory with ``train.jsonl`` and ``val.jsonl``.
        steps: RL steps.
        geometry: from :func:`scale_geometry`.
        interface: :func:`micro_batch_interface` of the installed loop.
        max_new_tokens: response token limit.
        model_class: the tiny model's ``from_pretrained`` class when it is not the
            standard causal LM (a VLM: ``'AutoModelForImageTextToText'``, whose processor
            is then read from ``model_dir``).

    Returns:
        A plain dict config (dump it with ``mmengine.Config(...).dump``).
    """
    out = copy.deepcopy(_plain(cfg))
    model = out['model']
    model.update(pretrained=model_dir, torch_dtype='float32')
    for key in ('tokenizer', 'processor', 'model_class', 'trust_remote_code'):
        model.pop(key, None)
    if model_class is not None:
        model['model_class'] = model_class
    loader = out['train_dataloader']
    loader['batch_size'] = geometry.prompts_per_rank
    loader['num_workers'] = 0
    if loader['dataset'].get('type') == 'PromptMixture':  # the smoke records are one file
        loader['dataset'] = dict(type='PromptDataset')
    loader['dataset']['path'] = f'{data_dir}/train.jsonl'
    loop = out['train_cfg']
    loop.update(max_steps=steps, rollout=dict(type='HFRolloutBackend'),
                minibatch_responses_per_rank=geometry.minibatch_responses_per_rank)
    loop['sampling'] = dict(loop.get('sampling') or {}, max_new_tokens=max_new_tokens)
    for key in ('micro_batch_size', 'logprob_batch_size', 'max_tokens_per_micro_batch',
                'logprob_max_tokens_per_micro_batch', 'prompts_per_step', 'minibatch_responses'):
        loop.pop(key, None)
    optim = out['optim_wrapper']
    optim.pop('accumulative_counts', None)
    if interface == 'tokens':
        loop['max_tokens_per_micro_batch'] = geometry.max_tokens_per_micro_batch
    else:
        loop['micro_batch_size'] = geometry.micro_batch_size
        loop['logprob_batch_size'] = geometry.micro_batch_size
        optim['accumulative_counts'] = geometry.micro_batches
    val = dict(loop.get('val') or {})
    val.pop('benchmarks', None)
    val.update(path=f'{data_dir}/val.jsonl', interval=steps)
    loop['val'] = val
    hooks = out.setdefault('default_hooks', {})
    hooks['checkpoint'] = dict(hooks.get('checkpoint') or dict(type='CheckpointHook'),
                               interval=steps, by_epoch=False)
    out['env_cfg'] = dict(out.get('env_cfg') or {}, dist_cfg=dict(backend='gloo'))
    out['model_wrapper_cfg'] = dict(type='MMDistributedDataParallel', device_ids=None,
                                    find_unused_parameters=bool(
                                        out.get('find_unused_parameters', False)))
    out['launcher'] = 'none'
    return out


def _plain(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A config as nested plain dicts and lists (``ConfigDict`` -> ``dict``)."""
    return cfg.to_dict() if hasattr(cfg, 'to_dict') else dict(cfg)


# ---------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------


def step_metrics(work_dir: str | Path) -> dict[int, dict[str, float]]:
    """Logged scalars by step, merged over the run's ``*/vis_data/scalars.json`` files.

    Args:
        work_dir: the run's work directory.

    Returns:
        ``{step: {name: value}}``; step 0 holds the validation before training.
    """
    out: dict[int, dict[str, float]] = {}
    for path in sorted(Path(work_dir).glob('*/vis_data/scalars.json')):
        for line in path.read_text(encoding='utf-8').splitlines():
            if line.strip():
                row = json.loads(line)
                out.setdefault(int(row.pop('step')), {}).update(row)
    return out


def domains_of(rewards: Mapping[str, Any]) -> dict[str, str]:
    """Domain -> record format for a config's ``train_cfg.rewards``.

    Args:
        rewards: ``train_cfg.rewards``.

    Returns:
        Every configured domain (``'default'`` included) with :func:`reward_kind`.
    """
    return {domain: reward_kind(fn) for domain, fn in rewards.items()}



# ---------------------------------------------------------------------------------------
# preparing and launching a run
# ---------------------------------------------------------------------------------------


@dataclass
class SmokePlan:
    """Everything a smoke run needs on disk, and what was chosen for it.

    Attributes:
        config_path: the smoke config (a self-contained pure-dict config file).
        run_dir: the training work directory.
        model_dir: the tiny model and tokenizer.
        data_dir: ``train.jsonl`` and ``val.jsonl``.
        family: the tiny model family.
        seed: the weight seed chosen (:func:`prepare_smoke_run`).
        geometry: the scaled batch.
        interface: the loop's micro-batching interface (``'tokens'`` or ``'rows'``).
        rewards: per domain, the reward rate and share of mixed groups that the tiny
            policy's own samples got under the chosen references.
        replaced: ``what -> (config value, smoke value)`` of the swapped parts.
        cached: the model and records came from ``cache_dir`` (:func:`prepare_smoke_run`).
    """

    config_path: Path
    run_dir: Path
    model_dir: Path
    data_dir: Path
    family: TinyFamily
    seed: int
    geometry: SmokeGeometry
    interface: str
    rewards: dict[str, dict[str, float]]
    replaced: dict[str, tuple[str, str]]
    cached: bool = False


def _describe_type(cfg: Any) -> str:
    return str(cfg.get('type')) if isinstance(cfg, Mapping) else str(cfg)


def _prepared_key(inputs: Mapping[str, Any]) -> str:
    """The cache key of a prepared model and record set: a SHA-256 over everything that
    decides them (the config's rewards and sampling, K, the record counts, the seeds), the
    versions of torch, transformers and this package, and this module's own source."""
    import torch
    import transformers

    from .. import __version__
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(json.dumps(dict(inputs, versions=[torch.__version__, transformers.__version__,
                                                    __version__]),
                             sort_keys=True, default=str).encode())
    return digest.hexdigest()[:32]


def _cached_prepared(cache: Path, out_dir: Path) -> dict[str, Any] | None:
    """Copies a cached ``model/`` and ``data/`` into ``out_dir``; their metadata, or None
    when ``cache`` holds no complete entry."""
    try:
        meta = json.loads((cache / 'meta.json').read_text(encoding='utf-8'))
    except (OSError, ValueError):
        return None
    for name in ('model', 'data'):
        if (out_dir / name).exists():
            shutil.rmtree(out_dir / name)
        shutil.copytree(cache / name, out_dir / name)
    return meta


def _store_prepared(cache: Path, out_dir: Path, meta: Mapping[str, Any]) -> None:
    """Writes ``out_dir``'s ``model/`` and ``data/`` with ``meta`` as the entry ``cache``,
    whole or not at all (built beside it, then renamed); a concurrent writer's entry wins."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.parent / f'.{cache.name}.{os.getpid()}.tmp'
    shutil.rmtree(tmp, ignore_errors=True)
    for name in ('model', 'data'):
        shutil.copytree(out_dir / name, tmp / name)
    (tmp / 'meta.json').write_text(json.dumps(meta), encoding='utf-8')
    try:
        os.rename(tmp, cache)
    except OSError:  # another process stored the same entry first
        shutil.rmtree(tmp, ignore_errors=True)


def _prepare_model_and_records(out_dir: Path, family: TinyFamily, tok: Any,
                               kinds: Mapping[str, str], router: Any,
                               train: list[dict[str, Any]], *, k: int, n_train: int, n_val: int,
                               seeds: Sequence[int], sample_args: Mapping[str, Any],
                               processor: Any = None) -> dict[str, Any]:
    """The seed search and the calibration of :func:`prepare_smoke_run`: writes
    ``out_dir/model`` and ``out_dir/data``; returns ``{'seed', 'rewards'}`` (the train
    split's report). A VLM's records carry images under ``out_dir/data/images``."""
    data_dir = out_dir / 'data'
    images = dict(processor=processor, image_root=data_dir) if family.vision else {}
    image_id = tok.convert_tokens_to_ids(IMAGE_PLACEHOLDER) if family.vision else None
    probe = [r for r in train if kinds[r['domain']] != 'code'][:4 * len(kinds)]
    best: tuple[float, int] | None = None
    for seed in seeds:
        model = build_smoke_model(family, len(tok), seed, image_token_id=image_id)
        _, report = calibrate_records(probe, kinds,
                                      sample_completions(model, tok, probe, k, **sample_args,
                                                         **images),
                                      router.fn_for)
        worst = min((v['mixed_groups'] for v in report.values()), default=1.0)
        if best is None or worst > best[0]:
            best = (worst, seed)
        if worst >= 0.5:
            break
    assert best is not None
    seed = best[1]
    model = build_smoke_model(family, len(tok), seed, image_token_id=image_id)
    model_dir = out_dir / 'model'
    model.save_pretrained(model_dir, safe_serialization=True)
    (processor if processor is not None else tok).save_pretrained(model_dir)
    splits = {}
    for split, n, s in (('train', n_train, 0), ('val', n_val, 1)):
        drafts = train if split == 'train' else make_records(kinds, 2 * n, seed=s)
        if family.vision and split == 'val':
            drafts = add_images(drafts, data_dir, split)
        done, report = calibrate_records(
            drafts, kinds,
            sample_completions(model, tok, drafts, k, seed=s, **sample_args, **images),
            router.fn_for, keep=n)
        for rec in done:
            rec['id'] = f'{split}-{rec["id"]}'
        splits[split] = report
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / f'{split}.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in done),
                                                 encoding='utf-8')
    return dict(seed=seed, rewards=splits['train'])


def train_records_per_domain(cfg: Mapping[str, Any], *, steps: int, world_size: int,
                             n_train: int) -> int:
    """Training records per domain a smoke run needs: at least ``n_train``, and enough that
    ``steps`` full batches of the scaled geometry on ``world_size`` ranks never reach the end
    of an epoch, ``ceil(prompts_per_step * steps / num_domains)``.

    Args:
        cfg: the loaded config; steps: RL steps; world_size: training processes;
        n_train: the floor asked for.
    """
    loop = cfg.get('train_cfg') or {}
    per_rank = int(cfg['train_dataloader']['batch_size'])
    minibatch = int(loop.get('minibatch_responses_per_rank', 32)) * world_size
    prompts = scale_geometry(int(loop.get('num_responses', 8)), per_rank * world_size,
                             minibatch, world_size, 1).prompts_per_step
    return max(n_train, math.ceil(prompts * steps / len(domains_of(loop['rewards']))))


def prepare_smoke_run(cfg: Mapping[str, Any], out_dir: str | Path, *, steps: int,
                      world_size: int, max_new_tokens: int = 12, n_train: int = 8,
                      n_val: int = 1, seeds: Sequence[int] = range(8),
                      cache_dir: str | Path | None = None) -> SmokePlan:
    """Writes the tiny model, the calibrated records and the smoke config under ``out_dir``.

    The weight seed is the first of ``seeds`` whose model gets mixed rewards (as its
    own samples, scored by the config's real reward functions) on at least half of the
    probe records of every answer-checked domain (code is exempt: random text rarely
    is a program); failing that, the best seed.

    Args:
        cfg: the loaded config (loaded with ``WORLD_SIZE=world_size``).
        out_dir: directory for ``model/``, ``data/``, ``run/`` and ``smoke_config.py``.
        steps: RL steps.
        world_size: training processes.
        max_new_tokens: response token limit.
        n_train: training records per domain, at least; raised to what ``steps`` full
            batches of the scaled geometry on ``world_size`` ranks draw, so that no
            step of the run trains on a partial batch (the end of an epoch).
        n_val: validation records per domain.
        seeds: weight seeds to try.
        cache_dir: where prepared models and record sets are kept for reuse (None: no
            cache). The seed search and the calibration score thousands of samples with
            the real verifiers (code runs in the sandbox); configs that differ only in
            what they train with (the algorithm, the optimizer) share one entry, keyed
            by :func:`_prepared_key`. The smoke config is written for each call.

    Returns:
        The plan.

    Raises:
        ValueError: the config is not an RL config of this package (no
            ``train_cfg.rewards``) or its batch cannot be scaled.
    """
    from mmengine.config import Config

    from ..reward import RewardRouter

    out_dir = Path(out_dir)
    loop = cfg.get('train_cfg') or {}
    if not loop.get('rewards'):
        raise ValueError('train_cfg.rewards is missing: not an RL config of gepo_xtuner')
    kinds = domains_of(loop['rewards'])
    family = choose_family(cfg.get('policy_model_type'))
    tok = build_smoke_tokenizer(vision=family.vision)
    processor = None
    if family.vision:
        from .tiny_interns1 import build_interns1_processor
        processor = build_interns1_processor(tok)
    k = int(loop.get('num_responses', 8))
    per_rank = int(cfg['train_dataloader']['batch_size'])
    minibatch = int(loop.get('minibatch_responses_per_rank', 32)) * world_size
    n_train = train_records_per_domain(cfg, steps=steps, world_size=world_size, n_train=n_train)
    sampling = dict(loop.get('sampling') or {})
    sample_args = dict(template=loop.get('prompt_template', '{prompt}'),
                       temperature=float(sampling.get('temperature', 1.0)),
                       top_p=float(sampling.get('top_p', 1.0)),
                       top_k=int(sampling.get('top_k', 0) or 0), max_new_tokens=max_new_tokens)
    train = make_records(kinds, 2 * n_train, seed=0)  # calibration keeps the better half
    model_dir, data_dir = out_dir / 'model', out_dir / 'data'
    if family.vision:
        train = add_images(train, data_dir, 'train')
    cache = None if cache_dir is None else Path(cache_dir) / _prepared_key(dict(
        family=[family.name, family.model_class], rewards=_plain(loop['rewards']), k=k, sampling=sample_args,
        n_train=n_train, n_val=n_val, seeds=list(seeds)))
    meta = None if cache is None else _cached_prepared(cache, out_dir)
    cached = meta is not None
    if meta is None:
        meta = _prepare_model_and_records(
            out_dir, family, tok, kinds, RewardRouter(loop['rewards']), train, k=k, n_train=n_train, n_val=n_val,
            seeds=seeds, sample_args=sample_args, processor=processor)
        if cache is not None:
            _store_prepared(cache, out_dir, meta)
    seed = int(meta['seed'])
    if family.vision:  # images expand to their tiles' tokens
        from ..engine.step.prompt_encoding import encode_request
        prompt_tokens = max(len(encode_request(_with_paths(r, data_dir), tok, processor,
                                               sample_args['template']).prompt_ids)
                            for r in train)
    else:
        prompt_tokens = max(len(tok(sample_args['template'].format(**r))['input_ids'])
                            for r in train)
    geometry = scale_geometry(k, per_rank * world_size, minibatch, world_size,
                              prompt_tokens + max_new_tokens)
    from mmengine.registry import LOOPS
    interface = micro_batch_interface(LOOPS.get('RLTrainLoop'))
    smoke = smoke_config(cfg, model_dir=str(model_dir), data_dir=str(data_dir), steps=steps,
                         geometry=geometry, interface=interface, max_new_tokens=max_new_tokens,
                         model_class='AutoModelForImageTextToText' if family.vision else None)
    config_path = out_dir / 'smoke_config.py'
    Config(smoke).dump(str(config_path))
    replaced = {
        'model': (f'{cfg.get("policy_name") or cfg["model"].get("pretrained")} '
                  f'({cfg["model"].get("torch_dtype", "float32")})',
                  f'tiny random {family.model_class} (float32, seed {seed})'
                  + (', image records of 1, 3 and 5 tiles' if family.vision else '')),
        'rollout': (_describe_type(loop.get('rollout')),
                    'HFRolloutBackend (LMDeploy needs a GPU; HF generate in the trainer)'),
        'max_new_tokens': (str(sampling.get('max_new_tokens')), str(max_new_tokens)),
        'process group': (str((cfg.get('env_cfg') or {}).get('dist_cfg', {}).get('backend')),
                          'gloo'),
    }
    return SmokePlan(config_path=config_path, run_dir=out_dir / 'run', model_dir=model_dir,
                     data_dir=data_dir, family=family, seed=seed, geometry=geometry,
                     interface=interface, rewards=meta['rewards'], replaced=replaced,
                     cached=cached)


def train_command(python: str, config_path: str | Path, work_dir: str | Path, nproc: int,
                  master_port: int) -> list[str]:
    """XTuner's training program for one process, or under torchrun for ``nproc > 1``.

    Both forms exit non-zero when training fails (the ``xtuner train`` wrapper does
    not).

    Args:
        python: the interpreter.
        config_path: the config file.
        work_dir: the training work directory.
        nproc: processes.
        master_port: torchrun's rendezvous port (``nproc > 1``).
    """
    train = ['-m', 'xtuner.tools.train', str(config_path), '--work-dir', str(work_dir)]
    if nproc == 1:
        return [python, *train]
    return [python, '-m', 'torch.distributed.run', '--nnodes=1', f'--nproc_per_node={nproc}',
            '--master_addr=127.0.0.1', f'--master_port={master_port}', *train,
            '--launcher', 'pytorch']
