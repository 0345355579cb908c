"""Atomic file writes: a reader sees the old file or the new one, never a part of either.

The one writer of every state file the package saves beside a checkpoint (the engine's
``atomic_local`` checkpoint backend, the integrations' GEPO band files). It imports only
the standard library, so the integrations for other trainers (TRL, verl, slime) use it
without mmengine.

A write goes to a temporary file ``.<name>.<8 random characters>.tmp`` in the target's
directory (a rename is atomic only within one file system), which is flushed and
``fsync``-ed, renamed over the target with ``os.replace`` and then the directory is
``fsync``-ed, so that after a crash or power loss the directory entry names the new
file and not a stale or empty one. A write that fails or is interrupted by an exception
removes its temporary file and leaves the target as it was; a process killed outright
(SIGKILL) can leave the temporary file, which :data:`TEMP_NAME` recognises.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

__all__ = ['TEMP_SUFFIX', 'TEMP_NAME', 'atomic_write_bytes', 'atomic_write_text',
           'atomic_write_json']

#: Suffix of the temporary files, named ``.<target>.<random>.tmp``.
TEMP_SUFFIX = '.tmp'
#: The full name of a temporary file of :func:`atomic_write_bytes`; group ``target`` is
#: the name of the file it was to replace. ``tempfile.mkstemp`` puts 8 characters of
#: ``[a-z0-9_]`` between prefix and suffix.
TEMP_NAME = re.compile(r'\.(?P<target>.+)\.[a-z0-9_]{8}' + re.escape(TEMP_SUFFIX))


def _fsync_directory(directory: Path) -> None:
    """Makes a rename in ``directory`` durable; a no-op where directories cannot be
    opened (Windows), whose file systems do not need it."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems (e.g. certain network mounts) refuse it
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Writes ``data`` to ``path`` atomically, creating its directory if needed.

    Args:
        path: the file to write (replaced if it exists).
        data: its whole new content.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OSError: the write, the fsync or the rename failed; ``path`` is unchanged and
            the temporary file is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f'.{path.name}.', suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, 'wb') as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # KeyboardInterrupt too: never leave a partial temporary behind
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = 'utf-8') -> Path:
    """:func:`atomic_write_bytes` of ``text`` encoded with ``encoding``."""
    return atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, **dumps_kwargs: Any) -> Path:
    """:func:`atomic_write_bytes` of ``json.dumps(obj, **dumps_kwargs)`` in UTF-8.

    The object is serialised before anything is written, so an object JSON cannot
    encode raises without touching ``path``.
    """
    return atomic_write_text(path, json.dumps(obj, **dumps_kwargs))
