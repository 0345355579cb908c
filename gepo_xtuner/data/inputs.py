"""Checks of records against what the policy's tokenizer and processor accept.

The record schema (:mod:`gepo_xtuner.data.records`) says what a record is; these
checks say whether a given policy can read it, before the first step:

* chat ``messages`` need a chat template (the processor's or the tokenizer's);
* every local image must decode;
* Qwen2-VL-family processors (``patch_size`` x ``merge_size``, 28 px for Qwen2-VL)
  refuse an image whose height or width is below that factor, or whose aspect ratio
  exceeds 200, when the step that draws it processes it;
* an image above the processor's ``max_pixels`` is decoded and downscaled each time
  a step draws it: a warning says which, and what resizing once would save.

:class:`PolicyInputs` holds those limits, read either from a model directory's files
(``tools/check_data.py --model``, ``tools/check_config.py``; no transformers import)
or from the loaded tokenizer and processor (the RL loop). Needs the standard library,
and Pillow for the images.
"""

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .records import is_url

__all__ = ['MAX_ASPECT_RATIO', 'PolicyInputs', 'check_all', 'check_inputs', 'image_size', 'scan_inputs']

#: Qwen2-VL's ``smart_resize`` refuses a longer side over 200 times the shorter one.
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True)
class PolicyInputs:
    """What a policy reads: whether it has a chat template, its image size limits.

    Attributes:
        source: where the facts come from, named in messages (a directory, or
            ``"the policy's tokenizer/processor"``).
        chat_template: whether chat ``messages`` can be rendered.
        min_side: the smallest height and width the processor accepts
            (``patch_size * merge_size``), or None for no limit known.
        max_pixels: the processor's ``max_pixels``; larger images are downscaled.
    """

    source: str
    chat_template: bool
    min_side: int | None = None
    max_pixels: int | None = None

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> 'PolicyInputs':
        """Reads a model, tokenizer or processor directory as ``from_pretrained`` would.

        The chat template is in ``chat_template.json`` or ``chat_template.jinja``
        (processor, newer tokenizers) or under ``chat_template`` in
        ``tokenizer_config.json``; the image limits in ``preprocessor_config.json``.
        """
        path = Path(path)
        config = _json(path / 'tokenizer_config.json')
        template = bool(config.get('chat_template')) or bool(
            _json(path / 'chat_template.json').get('chat_template')) or (
            path / 'chat_template.jinja').is_file()
        return cls(str(path), template, *_image_limits(_json(path / 'preprocessor_config.json')))

    @classmethod
    def from_objects(cls, tokenizer: Any, processor: Any = None) -> 'PolicyInputs':
        """The loaded tokenizer and processor (the ones the RL loop encodes prompts with)."""
        owners = (processor, getattr(processor, 'tokenizer', None), tokenizer)
        template = any(getattr(o, 'chat_template', None) for o in owners)
        image = getattr(processor, 'image_processor', None)
        limits = _image_limits(vars(image)) if image is not None else (None, None)
        return cls("the policy's tokenizer" + (' and processor' if processor else ''), template,
                   *limits)


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding='utf-8'))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _image_limits(config: dict[str, Any]) -> tuple[int | None, int | None]:
    """``(min_side, max_pixels)`` of a Qwen2-VL-style image processor's settings."""
    patch, merge = config.get('patch_size'), config.get('merge_size')
    min_side = patch * merge if isinstance(patch, int) and isinstance(merge, int) else None
    size = config.get('size') if isinstance(config.get('size'), dict) else {}
    max_pixels = config.get('max_pixels') or size.get('max_pixels') or (
        size.get('longest_edge') if min_side else None)
    return min_side, max_pixels if isinstance(max_pixels, int) else None


def image_size(path: str, decode: bool = True) -> tuple[int, int]:
    """``(width, height)`` of an image file.

    Args:
        path: a local file.
        decode: decode every pixel (finds truncated or corrupt data); otherwise only
            the header is read and the file's structure verified (PNG chunk CRCs).

    Raises:
        ValueError: the file is not an image Pillow can decode (the reason).
    """
    from PIL import Image
    try:
        with Image.open(path) as image:
            size = image.size
            if decode:
                image.load()
            else:
                image.verify()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ValueError(f'{type(exc).__name__}: {exc}') from None
    return size


def check_inputs(record: dict[str, Any], where: str, inputs: PolicyInputs | None,
                 decode: bool = True) -> tuple[list[str], list[str]]:
    """Problems and warnings of one validated record for a policy.

    Args:
        record: a record as :func:`~gepo_xtuner.data.records.validate_record` returns
            it (image paths resolved).
        where: ``FILE:LINE`` or ``record 'id'``, the prefix of every line.
        inputs: the policy's limits; None checks only that the images decode.
        decode: decode every pixel (see :func:`image_size`).

    Returns:
        ``(problems, warnings)``, one line each: ``WHERE: field 'X': reason; fix``.
    """
    problems: list[str] = []
    warnings: list[str] = []
    if inputs is not None and 'messages' in record and not inputs.chat_template:
        problems.append(
            f"{where}: field 'messages': chat turns need a chat template, and {inputs.source} "
            'has none; use the chat model\'s tokenizer (model.tokenizer, whose '
            'tokenizer_config.json sets chat_template), or give the text as "prompt"')
    for i, image in enumerate(record.get('images') or ()):
        if not isinstance(image, str) or is_url(image) or not os.path.isfile(image):
            continue  # URLs are not fetched; a missing file is the schema's problem
        at = f"{where}: field 'images[{i}]': {image}"
        try:
            width, height = image_size(image, decode=decode)
        except ValueError as exc:
            problems.append(f'{at} does not decode as an image ({exc}); re-save it as PNG or '
                            'JPEG, or remove it from the record')
            continue
        if inputs is None:
            continue
        if inputs.min_side and min(width, height) < inputs.min_side:
            problems.append(
                f'{at} is {width}x{height} px, below the {inputs.min_side} px per side that '
                f"{inputs.source}'s image processor needs (patch_size x merge_size); upscale "
                f'or pad it to at least {inputs.min_side}x{inputs.min_side} (e.g. '
                f'PIL.ImageOps.pad), or remove it')
        elif inputs.min_side and max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
            problems.append(f'{at} is {width}x{height} px, an aspect ratio over '
                            f'{MAX_ASPECT_RATIO} that the image processor refuses; crop or pad it')
        elif inputs.max_pixels and width * height > inputs.max_pixels:
            side = math.isqrt(inputs.max_pixels * width // height)
            warnings.append(
                f'{at} is {width}x{height} px ({width * height / 1e6:.1f} M), above the '
                f'max_pixels {inputs.max_pixels} of {inputs.source}: it is decoded and '
                'downscaled again on every step that draws it; resize it once beforehand (to '
                f'about {side}x{inputs.max_pixels // max(side, 1)} px) to save that time')
    return problems, warnings


def check_all(records: list[tuple[str, dict[str, Any]]], inputs: PolicyInputs | None,
              decode: bool = True, limit: int = 20) -> tuple[list[str], list[str]]:
    """:func:`check_inputs` over ``(where, record)`` pairs, each list cut at ``limit`` lines
    (a last line counts the rest)."""
    problems: list[str] = []
    warnings: list[str] = []
    for where, record in records:
        p, w = check_inputs(record, where, inputs, decode)
        problems += p
        warnings += w
    return _cut(problems, limit), _cut(warnings, limit)


def _cut(lines: list[str], limit: int) -> list[str]:
    if len(lines) <= limit:
        return lines
    return lines[:limit] + [f'... and {len(lines) - limit} more like these']


def scan_inputs(path: str | os.PathLike, inputs: PolicyInputs | None, *,
                required: tuple[str, ...] = (), fields: dict[str, str] | None = None,
                default_domain: str | None = None, decode: bool = True, limit: int = 20
                ) -> tuple[list[str], list[str]]:
    """:func:`check_inputs` for every record of a file that passes the schema.

    Records the schema refuses are skipped (:func:`~gepo_xtuner.data.records.scan_file`
    reports them); ``where`` is ``FILE:LINE`` (``FILE:row N``).
    """
    from .records import DataFormatError, check_field_map, default_id, read_rows, validate_record

    fields = check_field_map(fields)
    base = Path(path).absolute().parent

    def valid():
        try:
            for where, index, raw in read_rows(path):
                try:
                    yield where, validate_record(raw, where, base_dir=base, required=required,
                                                 default_id=default_id(path, index),
                                                 fields=fields, default_domain=default_domain)
                except DataFormatError:
                    continue
        except (DataFormatError, FileNotFoundError):
            return

    return check_all(list(valid()), inputs, decode=decode, limit=limit)
