"""What loading a policy checkpoint needs: transformers version, its own code, class, processor.

``tools/check_config.py`` refuses a config whose policy cannot be loaded in the
environment it runs in, with the fix (:func:`loading_problems`); ``RLPolicy`` would
otherwise fail minutes into a cluster job, or, worse, load a vision-language checkpoint
as a text model and refuse every image record.

The requirements are what each family's publisher states and what was measured here
(docs/multimodal.md, "Which environment loads Intern-S1-mini"):

* ``interns1`` (Intern-S1, Intern-S1-mini): custom code on the hub (``auto_map``
  in ``config.json``), which needs transformers >= 4.53 (its user guide: ``qwen3``,
  the ``got_ocr2`` image processor and ``modeling_layers``); loaded with
  ``AutoModelForCausalLM`` (its ``auto_map`` entry, a ``...ForConditionalGeneration``)
  and ``AutoProcessor``, both with ``trust_remote_code=True``. xtuner 0.2.0 pins 4.48:
  the transformers-5 overlay (docs/transformers5.md) is the environment that loads it.
* ``internvl`` (the same architecture natively, transformers >= 4.52):
  ``AutoModelForImageTextToText`` and ``AutoProcessor``, no custom code.
* ``qwen3_5`` (transformers 5), ``qwen3`` (4.51), ``qwen2_vl`` (4.45).
"""

from __future__ import annotations

import re

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ['FAMILIES', 'PolicyFamily', 'loading_problems', 'version_tuple']

#: the class ``RLPolicy`` loads by default (a text model)
TEXT_MODEL_CLASS = 'AutoModelForCausalLM'
OVERLAY_HINT = ('run it with transformers 5 first on the path: `make tf5-deps`, then '
                'PYTHONPATH=$PWD/work_dirs/tf5_deps for this command and `xtuner train` '
                '(docs/transformers5.md), or `pip install transformers==5.23.0` in the '
                'training environment')


@dataclass(frozen=True)
class PolicyFamily:
    """What one ``model_type`` needs to load.

    Attributes:
        name: the family as users know it.
        min_transformers: the oldest transformers that loads it.
        remote_code: published checkpoints ship their own code (``auto_map``).
        vision: the checkpoint holds a vision tower that image records need, and the
            policy then needs a processor.
        model_class: the ``from_pretrained`` class that loads the whole checkpoint.
    """

    name: str
    min_transformers: str
    remote_code: bool = False
    vision: bool = False
    model_class: str = TEXT_MODEL_CLASS


FAMILIES: dict[str, PolicyFamily] = {
    'interns1': PolicyFamily('Intern-S1', '4.53', remote_code=True, vision=True,
                             model_class=TEXT_MODEL_CLASS),
    'internvl': PolicyFamily('InternVL', '4.52', vision=True,
                             model_class='AutoModelForImageTextToText'),
    'qwen3_5': PolicyFamily('Qwen3.5', '5.0'),
    'qwen3': PolicyFamily('Qwen3', '4.51'),
    'qwen2_vl': PolicyFamily('Qwen2-VL', '4.45', vision=True,
                             model_class='AutoModelForImageTextToText'),
}


def version_tuple(version: str) -> tuple[int, ...]:
    """``'4.48.0'`` -> ``(4, 48, 0)`` (pre-release suffixes ignored)."""
    out = []
    for part in version.split('.'):
        digits = re.match(r'\d*', part).group()
        if not digits:
            break
        out.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(out)


def loading_problems(model: Mapping[str, Any], model_type: str | None,
                     config_json: Mapping[str, Any] | None = None,
                     transformers_version: str | None = None,
                     native_types: frozenset[str] | None = None) -> list[str]:
    """Why ``RLPolicy(**model)`` cannot load its checkpoint here (empty: nothing known).

    Args:
        model: the config's ``model`` dict (``model_class``, ``processor``,
            ``trust_remote_code``).
        model_type: the checkpoint's ``model_type`` (its ``config.json``, else the
            config's ``policy_model_type``); None: nothing to check.
        config_json: the checkpoint's ``config.json`` when it is at hand.
        transformers_version: default: the installed one.
        native_types: ``model_type`` values the installed transformers knows (default:
            its ``CONFIG_MAPPING``).

    Returns:
        One sentence per problem, each naming the fix (version, flag or class).
    """
    if not model_type:
        return []
    if transformers_version is None or native_types is None:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
        transformers_version = transformers_version or transformers.__version__
        native_types = native_types or frozenset(CONFIG_MAPPING_NAMES)
    family = FAMILIES.get(model_type)
    label = f'model_type {model_type!r}' + (f' ({family.name})' if family else '')
    problems = []
    if family and version_tuple(transformers_version) < version_tuple(family.min_transformers):
        problems.append(f'{label} needs transformers >= {family.min_transformers}, and this '
                        f'environment has {transformers_version} (xtuner 0.2.0 pins 4.48); '
                        + OVERLAY_HINT)
    own_code = bool((config_json or {}).get('auto_map')) or (
        family is not None and family.remote_code and model_type not in native_types)
    trusted = bool(model.get('trust_remote_code', False))
    if model_type not in native_types and own_code and not trusted:
        problems.append(f'{label} is loaded from the code it ships (config.json auto_map), '
                        'which transformers runs only when allowed: set '
                        'model.trust_remote_code=True (the launched LMDeploy server then gets '
                        '--trust-remote-code too)')
    if model_type not in native_types and not own_code and not problems:
        problems.append(f'transformers {transformers_version} does not know {label} and the '
                        'checkpoint ships no code for it (no auto_map in config.json): install a '
                        'transformers that has it')
    model_class = model.get('model_class', TEXT_MODEL_CLASS)
    if family and family.vision and model_class == TEXT_MODEL_CLASS \
            and not family.remote_code and not model.get('processor'):
        problems.append(f'{label} is a vision-language checkpoint, and model.model_class '
                        f'{TEXT_MODEL_CLASS!r} without a processor loads it as a text model '
                        f'that refuses image records: set model.model_class='
                        f'{family.model_class!r} (its processor is then read from pretrained)')
    if family and family.vision and family.remote_code and not model.get('processor'):
        problems.append(f'{label}: set model.processor (the checkpoint directory) so image '
                        'records are encoded with its processor; with model_class '
                        f'{model_class!r} none is loaded otherwise')
    return problems
