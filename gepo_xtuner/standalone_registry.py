"""The registries' behaviour where mmengine is not installed (a TRL, verl or slime run).

:mod:`gepo_xtuner.registry` builds its registries as children of mmengine's roots when
mmengine is importable (XTuner's training entry point finds them there). Without it,
each registry is a :class:`Registry` from this module, which keeps the part of
mmengine's contract that this package's own code and its users' configs rely on:

* ``register_module(name=None, force=False, module=None)``, as a decorator or a call;
  the registered name is the class name unless given, and a taken name raises
  ``KeyError`` unless ``force``;
* ``get(name)`` (None when unknown) and ``build(cfg, **default_args)`` from a dict whose
  ``type`` is a registered name or a class, the other keys being the constructor's
  keyword arguments (``_scope_`` is accepted and ignored);
* a lookup that misses imports the modules named in ``locations`` first, so that
  ``build(dict(type='GEPOAdvantage'))`` works before anything else was imported;
* ``module_dict``, ``name``, ``scope``, ``import_from_location()`` and ``parent``
  (None: there is no root registry to hang under).

Example:
    >>> reg = Registry('example', scope='demo')
    >>> @reg.register_module()
    ... class Scale:
    ...     def __init__(self, factor: float = 2.0):
    ...         self.factor = factor
    >>> reg.build(dict(type='Scale', factor=3.0)).factor
    3.0
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ['Registry']


class Registry:
    """A name -> class table with mmengine's registration and build rules (see module).

    Args:
        name: what the registry holds, used in error messages.
        scope: the package scope (``'gepo_xtuner'``).
        locations: modules imported on a lookup miss, whose import registers entries.
    """

    parent = None

    def __init__(self, name: str, scope: str = 'gepo_xtuner',
                 locations: Sequence[str] = ()) -> None:
        self.name = name
        self.scope = scope
        self.locations = list(locations)
        self._module_dict: dict[str, type] = {}
        self._imported = False

    @property
    def module_dict(self) -> dict[str, type]:
        """Registered name -> class."""
        return self._module_dict

    def __len__(self) -> int:
        return len(self._module_dict)

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def __repr__(self) -> str:
        return f'Registry(name={self.name!r}, items={sorted(self._module_dict)})'

    def import_from_location(self) -> None:
        """Imports every module of ``locations`` (once): their imports register entries."""
        if self._imported:
            return
        self._imported = True
        for location in self.locations:
            importlib.import_module(location)

    def get(self, key: str) -> type | None:
        """The class registered as ``key`` (``'gepo_xtuner.Name'`` also resolves), or None."""
        name = key.split('.', 1)[1] if key.startswith(f'{self.scope}.') else key
        if name not in self._module_dict:
            self.import_from_location()
        return self._module_dict.get(name)

    def register_module(self, name: str | None = None, force: bool = False,
                        module: type | None = None) -> Callable[[type], type] | type:
        """Registers ``module`` (or, as a decorator, the class it decorates).

        Raises:
            KeyError: the name is taken and ``force`` is False.
        """
        def register(cls: type) -> type:
            key = name or cls.__name__
            if not force and key in self._module_dict:
                raise KeyError(f'{key} is already registered in {self.name} '
                               f'at {self._module_dict[key].__module__}')
            self._module_dict[key] = cls
            return cls
        if module is not None:
            return register(module)
        return register

    def build(self, cfg: Mapping[str, Any], **default_args: Any) -> Any:
        """An instance from ``cfg``: ``type`` names the class, the rest are its kwargs.

        Raises:
            TypeError: ``cfg`` is not a mapping or has no ``type``.
            KeyError: ``type`` is not registered; the message lists what is.
        """
        if not isinstance(cfg, Mapping) or 'type' not in cfg:
            raise TypeError(f'{self.name}: a config must be a dict with a "type" key, got {cfg!r}')
        kwargs = {k: v for k, v in cfg.items() if k not in ('type', '_scope_')}
        for key, value in default_args.items():
            kwargs.setdefault(key, value)
        kind = cfg['type']
        cls = kind if isinstance(kind, type) else self.get(str(kind))
        if cls is None:
            raise KeyError(f'{kind} is not in the {self.name} registry; registered: '
                           f'{", ".join(sorted(self._module_dict))}')
        try:
            return cls(**kwargs)
        except Exception as e:  # name the class, as mmengine's builder does
            try:
                named = type(e)(f'class `{cls.__name__}` in {cls.__module__}: {e}')
            except Exception:  # noqa: BLE001 (an exception type with its own signature)
                raise e from None
            raise named from e
