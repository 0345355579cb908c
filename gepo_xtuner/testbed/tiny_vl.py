"""A tiny, randomly initialised Qwen2-VL with its processor, and picture tasks for it.

Everything is built locally from configs (no downloads): a character-level tokenizer
with Qwen2-VL's special tokens and chat template, a ``Qwen2VLImageProcessor`` limited
to a few patches per image, a Qwen2-VL with a one-block vision tower, and PNG pictures
of coloured squares with questions about them. It exercises the multimodal RL path
(image placeholders expanded inside the prompt, pixel patches per image, M-RoPE
positions) on a CPU in seconds; it learns nothing useful.
"""

import json
import os
import random
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    Qwen2TokenizerFast,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessor,
    Qwen2VLProcessor,
)

PAD, IM_START, IM_END = '<|endoftext|>', '<|im_start|>', '<|im_end|>'
VISION_START, VISION_END = '<|vision_start|>', '<|vision_end|>'
IMAGE_PAD, VIDEO_PAD = '<|image_pad|>', '<|video_pad|>'
VL_SPECIAL_TOKENS: tuple[str, ...] = (PAD, IM_START, IM_END, VISION_START, VISION_END,
                                      IMAGE_PAD, VIDEO_PAD, '<unk>')
VL_ALPHABET: str = '0123456789abcdefghijklmnopqrstuvwxyz+-*/=:,.()<>?! \n'
# Qwen2-VL's layout: the user turn holds images (as start / pad / end) and text parts.
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    '<|vision_start|><|image_pad|><|vision_end|>'
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    '{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}')
PATCH, MERGE = 14, 2  # a merged image token covers (PATCH * MERGE)^2 = 28 x 28 pixels
COLOURS: dict[str, tuple[int, int, int]] = {
    'red': (220, 30, 30), 'green': (30, 170, 60), 'blue': (40, 70, 220),
    'yellow': (235, 210, 30), 'black': (10, 10, 10)}


def build_vl_tokenizer() -> Qwen2TokenizerFast:
    """Character-level tokenizer over :data:`VL_ALPHABET` with Qwen2-VL's special tokens.

    No BOS (as Qwen); ``<|im_end|>`` is EOS, ``<|endoftext|>`` pads (on the left).
    """
    vocab = {tok: i for i, tok in enumerate(VL_SPECIAL_TOKENS + tuple(VL_ALPHABET))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token='<unk>'))
    # [\s\S]: every character, newlines included ('.' would skip them)
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r'[\s\S]'), behavior='isolated')
    core.decoder = decoders.Fuse()
    # Qwen2's tokenizer class (Qwen2VLProcessor accepts no other) over our own vocabulary
    return Qwen2TokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=IM_END, unk_token='<unk>',
        additional_special_tokens=[IM_START, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD],
        padding_side='left', clean_up_tokenization_spaces=False, model_max_length=512,
        chat_template=VL_CHAT_TEMPLATE)


def build_vl_processor(tokenizer: Qwen2TokenizerFast, min_pixels: int = 28 * 28,
                       max_pixels: int = 84 * 84) -> Qwen2VLProcessor:
    """Qwen2-VL's processor over ``tokenizer``, resizing images to few patches.

    An image is resized to a multiple of 28 pixels per side with ``min_pixels <= H * W
    <= max_pixels``; it becomes ``(H / 14) * (W / 14)`` patches (rows of ``pixel_values``)
    and ``H * W / 28**2`` ``<|image_pad|>`` tokens in the prompt. The defaults allow at
    most 9 image tokens per image.
    """
    images = Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels,
                                   patch_size=PATCH, merge_size=MERGE, temporal_patch_size=2)
    extra = {}
    import inspect

    import transformers
    if 'video_processor' in inspect.signature(Qwen2VLProcessor.__init__).parameters:  # >= 4.52
        extra['video_processor'] = transformers.Qwen2VLVideoProcessor(
            patch_size=PATCH, merge_size=MERGE, temporal_patch_size=2)
    return Qwen2VLProcessor(image_processor=images, tokenizer=tokenizer,
                            chat_template=VL_CHAT_TEMPLATE, **extra)


def build_tiny_vl_model(tokenizer: Qwen2TokenizerFast, seed: int,
                        **overrides) -> Qwen2VLForConditionalGeneration:
    """A ~0.2M-parameter Qwen2-VL (vision: 1 block, width 32; text: 2 layers, width 64).

    Args:
        tokenizer: gives the vocabulary size and the special-token ids.
        seed: the weights are a pure function of the seed and the config; the global
            torch RNG is left untouched.
        **overrides: any :class:`~transformers.Qwen2VLConfig` field.
    """
    ids = tokenizer.convert_tokens_to_ids
    cfg = {
        'vocab_size': len(tokenizer), 'hidden_size': 64, 'intermediate_size': 128,
        'num_hidden_layers': 2, 'num_attention_heads': 4, 'num_key_value_heads': 2,
        'max_position_embeddings': 512, 'rope_theta': 10_000.0, 'tie_word_embeddings': True,
        'attention_dropout': 0.0,
        # M-RoPE: (temporal, height, width) sections of the 8 rotary frequencies per head
        'rope_scaling': {'type': 'mrope', 'mrope_section': [2, 3, 3]},
        'vision_config': {'depth': 1, 'embed_dim': 32, 'hidden_size': 64, 'num_heads': 2,
                          'mlp_ratio': 2, 'patch_size': PATCH, 'spatial_merge_size': MERGE,
                          'temporal_patch_size': 2, 'in_channels': 3},
        'image_token_id': ids(IMAGE_PAD), 'video_token_id': ids(VIDEO_PAD),
        'vision_start_token_id': ids(VISION_START), 'vision_end_token_id': ids(VISION_END),
        'pad_token_id': tokenizer.pad_token_id, 'eos_token_id': tokenizer.eos_token_id,
        'bos_token_id': None, 'torch_dtype': 'float32', 'use_cache': True,
        'attn_implementation': 'eager'}
    cfg.update(overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2VLForConditionalGeneration(Qwen2VLConfig(**cfg)).float()


def save_tiny_vl(out_dir: str | os.PathLike, seed: int = 0) -> Path:
    """Writes model, tokenizer and processor to ``out_dir`` (loadable offline).

    Load it with ``RLPolicy(pretrained=out_dir, model_class='Qwen2VLForConditionalGeneration',
    ...)`` or ``AutoProcessor.from_pretrained(out_dir)``.
    """
    out = Path(out_dir)
    tokenizer = build_vl_tokenizer()
    build_tiny_vl_model(tokenizer, seed).save_pretrained(out)
    build_vl_processor(tokenizer).save_pretrained(out)
    return out


def draw_squares(path: str | os.PathLike, colour: str, count: int = 1,
                 size: tuple[int, int] = (56, 56)) -> Path:
    """A PNG of ``count`` squares of ``colour`` side by side on white (width x height ``size``)."""
    from PIL import Image, ImageDraw
    width, height = size
    side = min(height - 8, (width - 4) // count - 4)
    if side < 4:
        raise ValueError(f'{count} squares do not fit in a {width}x{height} image')
    image = Image.new('RGB', size, (255, 255, 255))
    draw = ImageDraw.Draw(image)
    top = (height - side) // 2
    for i in range(count):
        left = 4 + i * (side + 4)
        draw.rectangle([left, top, left + side - 1, top + side - 1], fill=COLOURS[colour])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format='PNG')
    return path


def build_picture_tasks(out_dir: str | os.PathLike, n: int, seed: int = 0,
                        name: str = 'train') -> Path:
    """``n`` chat records of two picture domains, written to ``out_dir/<name>.jsonl``.

    * ``colour``: "what colour is the square?" on one 56x56 picture of a square;
      the answer is a colour name.
    * ``count``: "how many squares?" on an 84x56 picture of 1-3 squares; the answer
      is a digit.

    The two sizes give different patch counts per image (16 and 24 patches), so
    batches mix images of different lengths. Each record is a ``messages`` user turn
    whose ``{"type": "image"}`` part places the image; ``images`` holds its path
    relative to the JSONL file (PNG files under ``out_dir/images``).
    """
    rng = random.Random(seed)
    out = Path(out_dir)
    lines = []
    for i in range(n):
        colour = rng.choice(sorted(COLOURS))
        image = Path('images') / f'{name}-{i:04d}.png'
        if i % 2 == 0:
            draw_squares(out / image, colour)
            domain, question, answer = 'colour', 'what colour is the square?', colour
        else:
            count = rng.randint(1, 3)
            draw_squares(out / image, colour, count, size=(84, 56))
            domain, question, answer = 'count', 'how many squares?', str(count)
        content = [{'type': 'image'}, {'type': 'text', 'text': question}]
        lines.append(json.dumps({'id': f'{name}-{i}', 'domain': domain, 'answer': answer,
                                 'messages': [{'role': 'user', 'content': content}],
                                 'images': [image.as_posix()]}))
    path = out / f'{name}.jsonl'
    path.write_text('\n'.join(lines) + '\n')
    return path
