"""A tiny, randomly initialised VLM in Intern-S1's layout, with its processor and picture tasks.

Intern-S1-mini (the paper's policy) is an InternViT vision encoder, a pixel-shuffle MLP
projector and a Qwen3 language model. Its checkpoint ships its own code (``model_type``
``interns1``); transformers has the same architecture natively as ``internvl``
(``InternVLForConditionalGeneration``, transformers >= 4.52), with the same parameter
names (``model.vision_tower.*``, ``model.multi_modal_projector.*``,
``model.language_model.*``, ``lm_head.*``) and the same processor (``GotOcr2ImageProcessor``
tiles + ``InternVLProcessor``), and LMDeploy 0.18 serves both with one module
(``lmdeploy/vl/model/internvl3_hf.py``). This module builds that architecture in
miniature from configs, nothing downloaded:

* vision: InternViT, 1 layer of width 32, tiles of 56 x 56 pixels, patch 14 (4 x 4
  patches), pixel shuffle with ``downsample_ratio`` 0.5: **4 image tokens per tile**
  (Intern-S1-mini: 448-pixel tiles, 256 tokens per tile);
* tiling as Intern-S1's processor does it: an image is cut into 1 to :data:`MAX_TILES`
  tiles by its aspect ratio, plus a thumbnail tile when it has more than one;
* prompt: each image is ``<IMG_CONTEXT>`` in the chat template, which the processor
  expands to ``<img>`` + ``<IMG_CONTEXT>`` x (4 x tiles) + ``</img>``;
* language model: Qwen3 (2 layers, width 64, q/k norms), untied LM head as Intern-S1-mini;
* a character-level tokenizer with Intern-S1's special tokens and a Qwen-style chat
  template.

What differs from the real checkpoint is listed in docs/multimodal.md ("Intern-S1 in
miniature"). Needs transformers >= 4.52 (the ``internvl`` classes): in this repository,
the transformers-5 overlay (``make tf5-deps``, docs/transformers5.md).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from .tiny_vl import COLOURS, draw_squares

PAD, IM_START, IM_END = '<|endoftext|>', '<|im_start|>', '<|im_end|>'
IMG_START, IMG_END, IMG_CONTEXT, VIDEO = '<img>', '</img>', '<IMG_CONTEXT>', '<video>'
INTERNS1_SPECIAL_TOKENS: tuple[str, ...] = (PAD, IM_START, IM_END, IMG_START, IMG_END,
                                            IMG_CONTEXT, VIDEO, '<unk>')
ALPHABET: str = '0123456789abcdefghijklmnopqrstuvwxyz+-*/=:,.()<>?! \n'
#: Qwen-style turns; an image part is ``<IMG_CONTEXT>`` and a newline, as the
#: ``InternVLProcessor`` chat templates write it.
INTERNS1_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    '<IMG_CONTEXT>\n'
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    '{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}')
TILE, PATCH = 56, 14
DOWNSAMPLE = 0.5
#: image tokens per tile: (TILE / PATCH)^2 * DOWNSAMPLE^2
TOKENS_PER_TILE = int((TILE // PATCH) ** 2 * DOWNSAMPLE ** 2)
MAX_TILES = 4


def _require_internvl() -> Any:
    import transformers
    if not hasattr(transformers, 'InternVLForConditionalGeneration'):
        raise ImportError(
            f'transformers {transformers.__version__} has no InternVLForConditionalGeneration '
            '(added in 4.52); the Intern-S1-shaped model needs transformers 5: `make tf5-deps`, '
            'then PYTHONPATH=$PWD/work_dirs/tf5_deps (docs/transformers5.md)')
    return transformers


def build_interns1_tokenizer() -> Any:
    """Character-level tokenizer over :data:`ALPHABET` with Intern-S1's special tokens.

    No BOS (as Qwen3); ``<|im_end|>`` is EOS, ``<|endoftext|>`` pads (on the left). The
    image tokens are the tokenizer's ``start_image_token`` / ``end_image_token`` /
    ``context_image_token`` (what ``InternVLProcessor`` and LMDeploy's
    ``InternVL3VisionModel`` read from it).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    transformers = _require_internvl()

    vocab = {tok: i for i, tok in enumerate(INTERNS1_SPECIAL_TOKENS + tuple(ALPHABET))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token='<unk>'))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r'[\s\S]'), behavior='isolated')
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(INTERNS1_SPECIAL_TOKENS))  # matched whole, before the split
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=IM_END, unk_token='<unk>',
        additional_special_tokens=[IM_START, IMG_START, IMG_END, IMG_CONTEXT, VIDEO],
        extra_special_tokens={'start_image_token': IMG_START, 'end_image_token': IMG_END,
                              'context_image_token': IMG_CONTEXT, 'video_token': VIDEO},
        padding_side='left', clean_up_tokenization_spaces=False, model_max_length=1024,
        chat_template=INTERNS1_CHAT_TEMPLATE)


def build_interns1_processor(tokenizer: Any, max_tiles: int = MAX_TILES) -> Any:
    """Intern-S1's processor layout over ``tokenizer``: ``GotOcr2ImageProcessor`` tiles of
    :data:`TILE` pixels (1 to ``max_tiles`` by aspect ratio, plus a thumbnail when more than
    one), ImageNet normalisation, :data:`TOKENS_PER_TILE` image tokens per tile."""
    transformers = _require_internvl()
    images = transformers.GotOcr2ImageProcessor(
        size={'height': TILE, 'width': TILE}, crop_to_patches=True, min_patches=1,
        max_patches=max_tiles, do_rescale=True, do_normalize=True,
        image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    videos = transformers.InternVLVideoProcessor(size={'height': TILE, 'width': TILE})
    return transformers.InternVLProcessor(image_processor=images, tokenizer=tokenizer,
                                          video_processor=videos,
                                          image_seq_length=TOKENS_PER_TILE,
                                          chat_template=INTERNS1_CHAT_TEMPLATE)


def build_tiny_interns1_model(tokenizer: Any, seed: int, text: dict[str, Any] | None = None,
                              vision: dict[str, Any] | None = None, **overrides: Any) -> Any:
    """A ~0.1M-parameter InternVL (InternViT 1 layer width 32; Qwen3 2 layers width 64).

    Args:
        tokenizer: gives the vocabulary size and the special-token ids.
        seed: the weights are a pure function of the seed and the config; the global
            torch RNG is left untouched.
        text: ``Qwen3Config`` fields over the tiny ones (e.g. a head size GPU kernels take).
        vision: ``InternVLVisionConfig`` fields over the tiny ones.
        **overrides: top-level ``InternVLConfig`` fields.

    Returns:
        ``InternVLForConditionalGeneration`` in float32.
    """
    import torch
    transformers = _require_internvl()

    ids = tokenizer.convert_tokens_to_ids
    text_config = transformers.Qwen3Config(**{
        'vocab_size': len(tokenizer), 'hidden_size': 64, 'intermediate_size': 128,
        'num_hidden_layers': 2, 'num_attention_heads': 4, 'num_key_value_heads': 2,
        'head_dim': 16, 'max_position_embeddings': 1024, 'rope_theta': 10_000.0,
        'tie_word_embeddings': False, 'attention_dropout': 0.0,
        'pad_token_id': tokenizer.pad_token_id, 'eos_token_id': tokenizer.eos_token_id,
        'bos_token_id': None, **(text or {})})
    config = internvl_config(text_config, ids(IMG_CONTEXT), vision=vision, **overrides)
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.InternVLForConditionalGeneration(config).float()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model.eval()


def internvl_config(text_config: Any, image_token_id: int, vision: dict[str, Any] | None = None,
                    **overrides: Any) -> Any:
    """``InternVLConfig`` of the tiny vision tower (InternViT, 1 layer of width 32, 56-pixel
    tiles, patch 14, pixel shuffle 0.5: 4 tokens per tile) over ``text_config``.

    Args:
        text_config: the language model's config (a ``Qwen3Config``).
        image_token_id: the id of ``<IMG_CONTEXT>``.
        vision: ``InternVLVisionConfig`` fields over the tiny ones.
        **overrides: top-level ``InternVLConfig`` fields.
    """
    transformers = _require_internvl()
    vision_config = transformers.InternVLVisionConfig(**{
        'hidden_size': 32, 'num_hidden_layers': 1, 'num_attention_heads': 2,
        'intermediate_size': 64, 'image_size': [TILE, TILE], 'patch_size': [PATCH, PATCH],
        'use_qk_norm': False, 'norm_type': 'layer_norm', 'layer_scale_init_value': 0.1,
        'use_mean_pooling': True, 'attention_dropout': 0.0, 'projection_dropout': 0.0,
        'hidden_dropout_prob': 0.0, **(vision or {})})
    cfg = dict(vision_config=vision_config, text_config=text_config,
               image_token_id=image_token_id,
               downsample_ratio=DOWNSAMPLE, projector_hidden_act='gelu',
               vision_feature_layer=-1, vision_feature_select_strategy='default',
               # the top-level flag decides tying whatever text_config says
               tie_word_embeddings=bool(getattr(text_config, 'tie_word_embeddings', False)))
    cfg.update(overrides)
    return transformers.InternVLConfig(**cfg)


def save_tiny_interns1(out_dir: str | os.PathLike, seed: int = 0, dtype: Any = None,
                       **sizes: Any) -> Path:
    """Writes model, tokenizer and processor to ``out_dir`` (loadable offline).

    ``dtype``: the saved weights' torch dtype (default float32); ``sizes``: the ``text`` /
    ``vision`` / top-level overrides of :func:`build_tiny_interns1_model`.

    Load it with ``RLPolicy(pretrained=out_dir, model_class='AutoModelForImageTextToText')``
    or LMDeploy (``InternVLForConditionalGeneration`` in ``config.json``).
    """
    out = Path(out_dir)
    tokenizer = build_interns1_tokenizer()
    model = build_tiny_interns1_model(tokenizer, seed, **sizes)
    if dtype is not None:
        model = model.to(dtype)
        model.config.torch_dtype = dtype
    model.save_pretrained(out)
    build_interns1_processor(tokenizer).save_pretrained(out)
    return out


#: Picture sizes (width, height) -> tiles the processor cuts (thumbnail included).
PICTURE_SIZES: dict[tuple[int, int], int] = {(56, 56): 1, (112, 56): 3, (112, 112): 5}


def build_interns1_picture_tasks(out_dir: str | os.PathLike, n: int, seed: int = 0,
                                 name: str = 'train') -> Path:
    """``n`` chat records with images of 1, 3 and 5 tiles, written to ``out_dir/<name>.jsonl``.

    * ``colour`` (one 56x56 or 112x112 picture of a square): the colour's name;
    * ``count`` (one 112x56 picture of 1-3 squares): the digit;
    * every sixth record (a ``colour`` one) carries two pictures (two image parts in a
      row) and asks for the first one's colour.

    So a batch mixes 1 or 2 images per prompt and 4 to 20 image tokens per image.
    """
    rng = random.Random(seed)
    out = Path(out_dir)
    lines = []
    for i in range(n):
        colour = rng.choice(sorted(COLOURS))
        stem = Path('images') / f'{name}-{i:04d}'
        if i % 2 == 1:
            count = rng.randint(1, 3)
            images = [draw_squares(out / f'{stem}.png', colour, count, size=(112, 56))]
            domain, question, answer = 'count', 'how many squares?', str(count)
        else:
            size = (56, 56) if i % 4 == 0 else (112, 112)
            images = [draw_squares(out / f'{stem}.png', colour, size=size)]
            domain, question, answer = 'colour', 'what colour is the square?', colour
            if i % 3 == 0:
                other = rng.choice(sorted(COLOURS))
                images.append(draw_squares(out / f'{stem}-b.png', other, size=(112, 56)))
                question = 'what colour is the first square?'
        content = [{'type': 'image'}] * len(images) + [{'type': 'text', 'text': question}]
        lines.append(json.dumps({
            'id': f'{name}-{i}', 'domain': domain, 'answer': answer,
            'messages': [{'role': 'user', 'content': content}],
            'images': [p.relative_to(out).as_posix() for p in images]}))
    path = out / f'{name}.jsonl'
    path.write_text('\n'.join(lines) + '\n')
    return path
