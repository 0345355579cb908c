"""Prompt records -> token ids (+ images) for the rollout: records with images go through
the policy's processor.

Records without images take :func:`gepo_xtuner.data.prompts.encode_prompt`, the
text path, unchanged. A record with ``images`` (local paths or URLs, already
resolved by the dataset) says where they go:

* ``messages`` records: ``{"type": "image"}`` content parts place the images, in
  order; ``<image>`` markers in string contents do the same (the verl / EasyR1
  convention); with neither, the images open the first user turn. The turns are
  rendered with the processor's chat template (else its tokenizer's), which writes
  the model's image placeholder, e.g. Qwen2-VL's
  ``<|vision_start|><|image_pad|><|vision_end|>``.
* ``prompt`` records: ``prompt_template.format(**record)`` must already contain the
  model's image placeholder once per image (prompts stored with the chat template
  applied).

The request then carries the prompt in both forms: ``input_ids`` (the text
tokenised, the template's bare placeholder once per image) with ``images`` for
inference servers, and the processor's ``model_input_ids`` (placeholders expanded to
one token per image feature, with whatever markers the processor writes around them)
with ``mm_inputs`` (``pixel_values``, ``image_grid_thw``, ...) for the policy's forward
passes and in-process generation. Each server backend sends the form its engine
expands into exactly ``model_input_ids`` (docs/multimodal.md, "What each engine is
sent"): LMDeploy the expanded ids with each run collapsed to one token
(``RolloutRequest.collapsed_prompt_ids``), vLLM the bare form.
"""

import os
from typing import Any

from torch import Tensor

from ...data.prompts import encode_prompt
from ...rollout import RolloutRequest

IMAGE_MARKER = '<image>'
# Per-token outputs: batches build their own masks from the ids. (``token_type_ids`` is
# dropped too; a model that needs it in training is not supported.)
TEXT_KEYS = ('input_ids', 'attention_mask', 'token_type_ids')


def encode_request(record: dict, tokenizer: Any, processor: Any = None,
                   template: str = '{prompt}') -> RolloutRequest:
    """The rollout request for one record (see the module docstring).

    Raises:
        ValueError: the record has images but there is no processor, the images do
            not match the placeholders, or an image cannot be loaded (the message
            names the record).
    """
    images = record.get('images')
    if not images:
        return RolloutRequest(encode_prompt(tokenizer, record, template))
    text, special = image_prompt_text(record, tokenizer, processor, template)
    try:
        encoded = processor(text=[text], images=[load_image(record, x) for x in images],
                            return_tensors='pt', **special)
    except ValueError as exc:  # e.g. Qwen2-VL: a side below patch_size x merge_size
        raise ValueError(f"record {record.get('id')!r} (images {list(images)}): the processor "
                         f'refused it: {exc}; tools/check_data.py FILE --model MODEL_DIR names '
                         'every such image with the fix') from None
    mm = {k: v for k, v in encoded.items() if k not in TEXT_KEYS and isinstance(v, Tensor)}
    request = RolloutRequest(tokenizer(text, **special)['input_ids'], images=list(images),
                             model_input_ids=encoded['input_ids'][0].tolist(), mm_inputs=mm,
                             image_token_id=image_token_id(processor, tokenizer))
    try:  # the engines' form must exist (e.g. two images whose token runs touch)
        request.collapsed_prompt_ids()
    except ValueError as exc:
        raise ValueError(f"record {record.get('id')!r}: {exc}") from None
    return request


def image_token_id(processor: Any, tokenizer: Any) -> int | None:
    """The id the processor repeats once per image feature (``None`` if it names none)."""
    value = getattr(processor, 'image_token_id', None)
    if isinstance(value, int):
        return value
    token = getattr(processor, 'image_token', None)
    if not isinstance(token, str):
        return None
    value = tokenizer.convert_tokens_to_ids(token)
    return value if isinstance(value, int) and value != tokenizer.unk_token_id else None


def prompt_token_ids(record: dict, tokenizer: Any, processor: Any = None,
                     template: str = '{prompt}') -> list[int]:
    """``encode_request(...).input_ids`` without processing the images (for servers)."""
    if not record.get('images'):
        return encode_prompt(tokenizer, record, template)
    text, special = image_prompt_text(record, tokenizer, processor, template)
    return tokenizer(text, **special)['input_ids']


def image_prompt_text(record: dict, tokenizer: Any, processor: Any, template: str
                      ) -> tuple[str, dict[str, Any]]:
    """The prompt text of a record with images, and the tokenizer arguments for it.

    Chat-rendered text already holds the template's special tokens, so it is
    tokenised with ``add_special_tokens=False`` (as ``apply_chat_template`` does).
    """
    where = f"record {record.get('id')!r}"
    num_images = len(record['images'])
    if processor is None:
        raise ValueError(
            f'{where} has images, but the policy has no processor: use a vision-language '
            "model (model.model_class, e.g. 'AutoModelForImageTextToText') and its processor "
            '(model.processor)')
    if 'messages' in record:
        messages = place_images(record['messages'], num_images, where)
        for owner in (processor, getattr(processor, 'tokenizer', None), tokenizer):
            if getattr(owner, 'chat_template', None):
                text = owner.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=False)
                return text, {'add_special_tokens': False}
        raise ValueError(f'{where} gives "messages", but neither the processor nor the '
                         'tokenizer has a chat template; give the prompt as text in "prompt" '
                         "with the model's image placeholder")
    text = template.format(**record)
    token = getattr(processor, 'image_token', None)
    if isinstance(token, str) and text.count(token) != num_images:
        raise ValueError(
            f"{where}: {num_images} images but the prompt contains the model's image "
            f'placeholder {token!r} {text.count(token)} times; write the prompt with the '
            'placeholder once per image (with its chat template applied), or give chat '
            '"messages" whose {"type": "image"} parts place the images')
    return text, {}


def place_images(messages: list[dict], num_images: int, where: str) -> list[dict]:
    """Chat turns whose content parts hold exactly ``num_images`` image parts.

    Image parts are kept; ``<image>`` markers in string contents become image parts;
    turns with neither get the images at the start of the first user turn.
    """
    turns = [dict(turn) for turn in messages]
    parts = sum(sum(1 for p in t['content'] if p.get('type') == 'image')
                for t in turns if isinstance(t['content'], list))
    markers = sum(t['content'].count(IMAGE_MARKER) for t in turns
                  if isinstance(t['content'], str))
    if parts and markers:
        raise ValueError(f'{where}: use either {{"type": "image"}} parts or "{IMAGE_MARKER}" '
                         'markers to place the images, not both')
    if parts or markers:
        if parts + markers != num_images:
            raise ValueError(f'{where}: the messages place {parts + markers} images but the '
                             f'record has {num_images}; give one image part (or marker) per '
                             'image, or none (the images then open the first user turn)')
        for turn in turns:
            if isinstance(turn['content'], str) and IMAGE_MARKER in turn['content']:
                turn['content'] = _split_markers(turn['content'])
        return turns
    for turn in turns:
        if turn['role'] == 'user':
            content = turn['content']
            content = [{'type': 'text', 'text': content}] if isinstance(content, str) \
                else list(content)
            turn['content'] = [{'type': 'image'}] * num_images + content
            return turns
    raise ValueError(f'{where}: the messages have no user turn to put the images in')


def _split_markers(text: str) -> list[dict]:
    parts: list[dict] = []
    for i, piece in enumerate(text.split(IMAGE_MARKER)):
        if i:
            parts.append({'type': 'image'})
        if piece:
            parts.append({'type': 'text', 'text': piece})
    return parts


def load_image(record: dict, image: Any) -> Any:
    """A record's image (local path, http(s) URL or data URI) as an RGB PIL image."""
    from transformers.image_utils import load_image as hf_load_image  # PIL: multimodal only
    try:
        return hf_load_image(os.fspath(image) if isinstance(image, os.PathLike) else image)
    except (OSError, ValueError) as exc:
        raise ValueError(f"record {record.get('id')!r}: cannot load image {image!r} ({exc})"
                         ) from None


def check_policy_inputs(record_sets: dict[str, list[dict]], tokenizer: Any, processor: Any = None
                        ) -> list[str]:
    """Checks records against the policy before the first step; returns the warnings.

    Chat records need a chat template, images must be readable images (header and
    structure; ``tools/check_data.py`` decodes every pixel) and at least the
    processor's smallest side; images above its ``max_pixels`` are warned about
    (:mod:`gepo_xtuner.data.inputs`).

    Args:
        record_sets: what the records are (e.g. ``'train_dataloader.dataset'``) -> records.

    Raises:
        ValueError: naming up to 20 bad records (id, field, file) with the fix.
    """
    from ...data.inputs import PolicyInputs, check_all

    inputs = PolicyInputs.from_objects(tokenizer, processor)
    problems, warnings = [], []
    for what, records in record_sets.items():
        pairs = [(f"{what}: record {r.get('id')!r}", r) for r in records
                 if 'messages' in r or r.get('images')]
        p, w = check_all(pairs, inputs, decode=False)
        problems += p
        warnings += w
    if problems:
        raise ValueError('records the policy cannot read:\n  ' + '\n  '.join(problems))
    return warnings
