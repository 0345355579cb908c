"""The keys ``train_cfg`` takes: refusing unknown ones, and every default in one place.

The RL loop's constructor signature is the one source of ``train_cfg``'s keys and
defaults; tools that read a config (``tools/check_config.py``) ask for them here
instead of keeping copies.
"""

import difflib
import inspect
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ['RENAMED_KEYS', 'accepted_keys', 'check_keys', 'defaults']

#: ``train_cfg`` keys of earlier versions -> the key that replaced them (refused with
#: the new name, see :func:`check_keys`).
RENAMED_KEYS = {'minibatch_size': 'minibatch_responses_per_rank'}

#: Constructor arguments that are not ``train_cfg`` keys.
NOT_KEYS = ('self', 'runner', 'dataloader')


def accepted_keys(init: Callable[..., Any]) -> list[str]:
    """The keyword arguments ``init`` takes (its ``**kwargs`` and non-config ones left out)."""
    params = inspect.signature(init).parameters
    return [name for name, p in params.items()
            if p.kind is not p.VAR_KEYWORD and name not in NOT_KEYS]


def defaults(init: Callable[..., Any]) -> dict[str, Any]:
    """``key -> default`` of every optional argument of ``init``."""
    params = inspect.signature(init).parameters
    return {name: params[name].default for name in accepted_keys(init)
            if params[name].default is not inspect.Parameter.empty}


def check_keys(init: Callable[..., Any], keys: Iterable[str]) -> None:
    """Refuses ``keys`` that ``init`` does not take, saying what was meant.

    Raises:
        TypeError: for each unknown key, the key that replaced it
            (:data:`RENAMED_KEYS`) or the closest key ``init`` takes.
    """
    accepted = accepted_keys(init)
    unknown = [key for key in keys if key not in accepted and key != 'type']
    if not unknown:
        return
    hints = []
    for key in unknown:
        if key in RENAMED_KEYS:
            hints.append(f'train_cfg.{key} was renamed: use train_cfg.{RENAMED_KEYS[key]}')
        elif close := difflib.get_close_matches(key, accepted, n=1):
            hints.append(f'did you mean train_cfg.{close[0]}?')
    names = ', '.join(repr(key) for key in unknown)
    plural = 's' if len(unknown) > 1 else ''
    raise TypeError(f'got an unexpected keyword argument{plural} {names}'
                    + (f' ({"; ".join(hints)})' if hints else ''))
