"""Start-up hook that lets xtuner 0.2.0 import under transformers 5 (docs/transformers5.md).

xtuner 0.2.0 pins transformers 4.48, which cannot load Qwen3.5 (model_type
``qwen3_5``, transformers >= 5). Under transformers 5, ``xtuner train`` stops at
import time on one name that transformers removed. ``xtuner/tools/train.py``
imports xtuner's modules before a config's ``custom_imports`` can import
gepo_xtuner, so the name has to be back before xtuner is imported. Installing
gepo-xtuner therefore also installs ``gepo_xtuner_transformers5.pth`` into
site-packages, whose single line calls :func:`install` at interpreter start-up.

What runs when:

* Start-up (every interpreter of the environment): :func:`install` puts one
  finder at the front of ``sys.meta_path``. Nothing is imported, nothing checked.
* First ``import xtuner.utils`` (the package whose module imports the removed
  name; ``import xtuner`` alone, as in the ``xtuner`` CLI's parent process, does
  not trigger): the finder removes itself, imports ``transformers.utils`` (which
  ``xtuner.utils`` is about to import anyway) and adds each name of
  :data:`REMOVED_NAMES` that the module lacks. Names transformers has (all of them
  on 4.x) are never replaced, so on transformers 4.48 nothing changes.

This module is top-level, outside the ``gepo_xtuner`` package, because importing
any ``gepo_xtuner`` submodule first runs the package's ``__init__`` (torch,
mmengine, transformers: seconds), which no interpreter start-up should pay.
"""

import importlib
import importlib.util
import sys
from collections.abc import Callable

__all__ = ['REMOVED_NAMES', 'TRIGGER', 'install', 'provide_removed_names', 'provided', 'uninstall']

# The import that fires the hook: xtuner/utils/__init__.py imports
# handle_moe_load_and_save.py, the module of xtuner 0.2.0 that imports a removed name.
TRIGGER = 'xtuner.utils'


def is_safetensors_available() -> bool:
    """Whether ``safetensors`` can be imported: transformers 4.x's check, same meaning.

    transformers 5 requires safetensors and dropped the function; xtuner 0.2.0
    imports it from ``transformers.utils`` (``xtuner/utils/handle_moe_load_and_save.py``,
    used when loading MoE checkpoints). Only the import made ``xtuner train`` fail.
    """
    return importlib.util.find_spec('safetensors') is not None


# module -> {name: object to provide when the module lacks the name}. Each entry is a
# name that xtuner 0.2.0's training entry point imports and transformers 5 removed.
REMOVED_NAMES: dict[str, dict[str, Callable]] = {
    'transformers.utils': {'is_safetensors_available': is_safetensors_available},
}

# 'module.name' of every name this process added (empty on transformers 4.x).
provided: list[str] = []


def provide_removed_names() -> list[str]:
    """Adds each name of :data:`REMOVED_NAMES` that its module lacks; never replaces one.

    Returns:
        The names added by this call, as ``'module.name'``. Empty if transformers
        is missing or cannot be imported: then the importer's own ``import
        transformers`` reports the problem where it happens.
    """
    added = []
    for module_name, names in REMOVED_NAMES.items():
        try:
            module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001, S112 -- the importer's own import shows the error
            continue
        for name, obj in names.items():
            if not hasattr(module, name):
                setattr(module, name, obj)
                added.append(f'{module_name}.{name}')
    provided.extend(added)
    return added


class _XtunerImportHook:
    """``sys.meta_path`` finder that never finds anything; it only notices :data:`TRIGGER`."""

    def find_spec(self, fullname: str, path=None, target=None) -> None:
        if fullname == TRIGGER:
            # Once is enough, and removing first keeps the imports below from re-entering.
            uninstall()
            provide_removed_names()
        # the regular finders load the module


def _installed() -> list[object]:
    return [f for f in sys.meta_path if isinstance(f, _XtunerImportHook)]


def install() -> bool:
    """Puts the hook first on ``sys.meta_path`` unless it is there or xtuner.utils is loaded.

    Returns:
        Whether the hook is now installed.
    """
    if TRIGGER in sys.modules:  # too late to matter; never patch behind xtuner's back
        return False
    if not _installed():
        sys.meta_path.insert(0, _XtunerImportHook())
    return True


def uninstall() -> None:
    """Removes the hook from ``sys.meta_path`` (no error if it is not there)."""
    for finder in _installed():
        try:
            sys.meta_path.remove(finder)
        except ValueError:  # another thread removed it first
            pass
