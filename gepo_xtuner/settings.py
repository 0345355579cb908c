"""What typed settings objects share: unknown keys refused with what was meant, value
types checked against the annotations, and each key's help text read from the class's
docstring (its ``Attributes:`` section, the one place a key is documented).

Used by :class:`~gepo_xtuner.engine.train_cfg.TrainCfg` (``train_cfg``),
:class:`~gepo_xtuner.engine.step.validation.ValSettings` (``train_cfg.val``) and
:class:`~gepo_xtuner.model.settings.PolicySettings` (``model``).
"""

import dataclasses
import difflib
import inspect
import re
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ['docstring_attributes', 'refuse_unknown', 'check_types', 'field_defaults']

_ENTRY = re.compile(r'^(\s*)(\w+)(?: \([^)]*\))?:\s*(.*)$')


def docstring_attributes(cls: type) -> dict[str, str]:
    """``name -> help`` from the ``Attributes:`` section of ``cls``'s Google-style
    docstring (an entry's continuation lines joined into one line)."""
    doc = inspect.getdoc(cls) or ''
    out: dict[str, str] = {}
    lines = doc.splitlines()
    try:
        start = lines.index('Attributes:') + 1
    except ValueError:
        return out
    indent: int | None = None
    current: str | None = None
    for line in lines[start:]:
        if line and not line.startswith(' '):  # the next section
            break
        match = _ENTRY.match(line)
        if match and (indent is None or len(match.group(1)) == indent):
            indent = len(match.group(1))
            current = match.group(2)
            out[current] = match.group(3).strip()
        elif current is not None and line.strip():
            out[current] = f'{out[current]} {line.strip()}'
    return out


def refuse_unknown(where: str, keys: Iterable[str], accepted: Iterable[str],
                   renamed: Mapping[str, str] | None = None) -> None:
    """Refuses ``keys`` not in ``accepted``, naming the key that replaced a renamed one
    or the closest accepted key.

    Args:
        where: the config path of the keys, e.g. ``'train_cfg'``.
        keys: the keys given.
        accepted: the keys taken.
        renamed: old key -> the key that replaced it.

    Raises:
        TypeError: ``got an unexpected keyword argument 'x' (did you mean where.y?)``.
    """
    accepted = list(accepted)
    renamed = renamed or {}
    unknown = [key for key in keys if key not in accepted]
    if not unknown:
        return
    hints = []
    for key in unknown:
        if key in renamed:
            hints.append(f'{where}.{key} was renamed: use {where}.{renamed[key]}')
        elif close := difflib.get_close_matches(key, accepted, n=1):
            hints.append(f'did you mean {where}.{close[0]}?')
    names = ', '.join(repr(key) for key in unknown)
    plural = 's' if len(unknown) > 1 else ''
    raise TypeError(f'got an unexpected keyword argument{plural} {names}'
                    + (f' ({"; ".join(hints)})' if hints else ''))


def field_defaults(cls: type) -> dict[str, Any]:
    """``name -> default`` of the dataclass fields of ``cls`` that have one."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _accepts(value: Any, annotation: Any) -> bool | None:
    """Whether ``value`` is of the annotated type; None where the annotation is not one
    of the plain kinds checked here (left to the object's own checks)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        verdicts = [_accepts(value, a) for a in typing.get_args(annotation)]
        return True if any(verdicts) else (None if None in verdicts else False)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if annotation is dict or origin is dict:
        return isinstance(value, Mapping)
    if origin is tuple or annotation is tuple:
        return isinstance(value, (list, tuple))
    return None


def _name(annotation: Any) -> str:
    text = getattr(annotation, '__name__', None) or str(annotation)
    return str(annotation).replace('typing.', '') if '|' in str(annotation) else text


def check_types(where: str, cls: type, values: Mapping[str, Any]) -> None:
    """Refuses values whose type is not the field's annotated one (``int``, ``float``,
    ``str``, ``bool``, ``dict``, tuples and their ``| None``), naming the key.

    Raises:
        TypeError: ``where.key must be int | None, got '3' (str)``.
    """
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        annotation = hints.get(key)
        if annotation is not None and _accepts(value, annotation) is False:
            raise TypeError(f'{where}.{key} must be {_name(annotation)}, got {value!r} '
                            f'({type(value).__name__})')
