"""Start-up hook that keeps bitsandbytes' CPU-build notice off the console where no GPU exists.

xtuner 0.2.0 installs bitsandbytes, and ``mmengine.optim`` imports it (to register its
8-bit optimizers) in every process that trains or uses this package: the ``xtuner``
command, its training program (before a config's ``custom_imports`` can import
gepo_xtuner), every tool. On a machine without CUDA, bitsandbytes 0.45 then loads its
CPU library and logs a warning through the ``bitsandbytes.cextension`` logger, which
Python's last-resort handler prints to stderr, twice per ``xtuner train``::

    The installed version of bitsandbytes was compiled without GPU support. 8-bit
    optimizers, 8-bit multiplication, and GPU quantization are unavailable.

Nothing in this package uses bitsandbytes, and without a GPU there is nothing to change.
Installing gepo-xtuner puts ``gepo_xtuner_quiet.pth`` into site-packages, whose line calls
:func:`install` at interpreter start-up (the training program imports mmengine before
any code of this package could run).

What runs when:

* Start-up (every interpreter of the environment): :func:`install` puts one finder at
  the front of ``sys.meta_path``. Nothing is imported, nothing checked.
* First lookup of ``bitsandbytes`` (its import, or a ``find_spec`` availability check):
  the finder adds :class:`CpuBuildNotice` to the ``bitsandbytes.cextension`` logger.
* The notice itself: dropped when torch sees no CUDA device; kept when it sees one (a
  CPU build beside a GPU means 8-bit optimizers will fail: that matters). Every other
  bitsandbytes message, warnings and errors included, is kept.

Top-level, outside the ``gepo_xtuner`` package, for the same reason as
``_gepo_xtuner_transformers5``: importing a ``gepo_xtuner`` submodule runs the package's
``__init__`` (torch, mmengine, transformers), which no interpreter start-up should pay.
"""

import sys
from collections.abc import Callable

__all__ = ['LOGGER', 'NOTICE', 'CpuBuildNotice', 'install', 'uninstall']

#: The logger bitsandbytes 0.45 logs the notice with (``logging.getLogger(__name__)``).
LOGGER = 'bitsandbytes.cextension'
#: How the notice starts (``bitsandbytes/cextension.py:get_native_library``).
NOTICE = 'The installed version of bitsandbytes was compiled without GPU support'


def _torch_sees_cuda() -> bool:
    """Whether torch (already imported by bitsandbytes when it logs) sees a CUDA device."""
    torch = sys.modules.get('torch')
    return bool(torch is not None and torch.cuda.is_available())


class CpuBuildNotice:
    """Drops bitsandbytes' CPU-build notice on machines without CUDA; passes everything else.

    A logging filter (an object with ``filter(record)``, as ``logging.Logger.addFilter``
    takes), not a ``logging.Filter`` subclass, so that start-up imports nothing.

    Args:
        cuda_available: whether a GPU is there to use, asked once per notice
            (default: torch's ``cuda.is_available()``).
    """

    def __init__(self, cuda_available: Callable[[], bool] = _torch_sees_cuda) -> None:
        self.cuda_available = cuda_available

    def filter(self, record) -> bool:
        return not str(record.msg).startswith(NOTICE) or self.cuda_available()


def _add_filter() -> None:
    import logging
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(f, CpuBuildNotice) for f in logger.filters):
        logger.addFilter(CpuBuildNotice())


class _BitsandbytesLookupHook:
    """``sys.meta_path`` finder that never finds anything; it notices ``bitsandbytes``."""

    done = False

    def find_spec(self, fullname: str, path=None, target=None) -> None:
        # Stays installed (a string compare per import): removing a finder while the
        # import system iterates over sys.meta_path would skip the next finder.
        if not self.done and fullname == 'bitsandbytes':
            self.done = True
            _add_filter()
        # the regular finders load the module


_HOOK = _BitsandbytesLookupHook()


def install() -> bool:
    """Puts the hook first on ``sys.meta_path``, or sets the filter at once if bitsandbytes
    is already loaded (its notice, printed at load, then went out already).

    Returns:
        Whether the hook is now installed.
    """
    if 'bitsandbytes' in sys.modules:
        _add_filter()
        return False
    if _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)
    return True


def uninstall() -> None:
    """Removes the hook and the filter (no error if they are not there)."""
    sys.meta_path[:] = [f for f in sys.meta_path if f is not _HOOK]
    _HOOK.done = False
    if 'logging' in sys.modules:
        import logging
        logger = logging.getLogger(LOGGER)
        for f in [f for f in logger.filters if isinstance(f, CpuBuildNotice)]:
            logger.removeFilter(f)
