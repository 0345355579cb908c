"""Checkpoint files: atomic writes (temp file, fsync, rename), leftovers, unreadable files."""

import re
import zipfile
from pathlib import Path

from mmengine.fileio import LocalBackend, register_backend

from ...atomic_io import TEMP_NAME, TEMP_SUFFIX, atomic_write_bytes

__all__ = ['TEMP_SUFFIX', 'CheckpointError', 'AtomicLocalBackend', 'stale_temporaries',
           'remove_stale_temporaries', 'checkpoint_problem', 'previous_good_checkpoint',
           'unreadable_checkpoint_message']

_NUMBERED = re.compile(r'(?P<kind>iter|epoch)_(?P<n>\d+)\.pth')


class CheckpointError(RuntimeError):
    """A checkpoint file cannot be loaded; the message names it and what to use instead."""


@register_backend('atomic_local')
class AtomicLocalBackend(LocalBackend):
    """Local files, but a write never leaves a half-written file behind.

    ``put``/``put_text`` write through :func:`~gepo_xtuner.atomic_io.atomic_write_bytes`
    (a temporary file in the destination directory, ``fsync``, ``os.replace`` over the
    target, ``fsync`` of the directory), so a process killed while
    saving a checkpoint leaves the previous checkpoint (and any file of the same
    name) intact. Select it with ``backend_args=dict(backend='atomic_local')``,
    e.g. on mmengine's ``CheckpointHook``.
    """

    def put(self, obj: bytes, filepath: str | Path) -> None:
        atomic_write_bytes(filepath, obj)

    def put_text(self, obj: str, filepath: str | Path, encoding: str = 'utf-8') -> None:
        atomic_write_bytes(filepath, obj.encode(encoding))


def stale_temporaries(directory: str | Path) -> list[Path]:
    """Temporary files an interrupted atomic write left in ``directory``.

    A process killed during a save (SIGKILL, out of memory, node failure) never renames
    its ``.<name>.<random>.tmp`` file: it is a partial copy of ``<name>`` that nothing
    reads. Only names of exactly that form count; nothing else is touched.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir()
                  if TEMP_NAME.fullmatch(p.name) and p.is_file())


def remove_stale_temporaries(directory: str | Path) -> list[tuple[Path, int]]:
    """Deletes :func:`stale_temporaries` of ``directory``; returns ``(path, bytes)`` removed.

    Call it only where no save of this run can be in flight (before training starts):
    a write in progress also has such a file.
    """
    removed = []
    for path in stale_temporaries(directory):
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:  # removed by another process meanwhile
            continue
        removed.append((path, size))
    return removed


def checkpoint_problem(path: str | Path) -> str | None:
    """Why a ``torch.save`` checkpoint file cannot be loaded, or None if it looks whole.

    Checks what can be checked without reading the whole file: that it exists, is not
    empty and is a zip archive (``torch.save``'s format since torch 1.6) whose central
    directory, written last, is complete. A file cut off during a save or a copy fails
    this; damage inside the data shows only when it is loaded.
    """
    path = Path(path)
    if not path.is_file():
        return 'no such file'
    size = path.stat().st_size
    if size == 0:
        return 'the file is empty'
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        return (f'not a complete torch checkpoint ({size} bytes; {exc}): it was cut off, '
                'e.g. by a kill during the save or an interrupted copy')
    if not any(name.endswith('data.pkl') for name in names):
        return f'a zip archive without data.pkl ({size} bytes): not a torch checkpoint'
    return None


def previous_good_checkpoint(path: str | Path) -> Path | None:
    """The newest other checkpoint of ``path``'s directory that passes :func:`checkpoint_problem`.

    For ``iter_N.pth`` / ``epoch_N.pth`` only earlier numbers of the same kind count;
    newest first.
    """
    path = Path(path)
    match = _NUMBERED.fullmatch(path.name)
    candidates = []
    for other in path.parent.glob('*.pth'):
        found = _NUMBERED.fullmatch(other.name)
        if other == path or found is None:
            continue
        if match and (found['kind'] != match['kind'] or int(found['n']) >= int(match['n'])):
            continue
        candidates.append((int(found['n']), other))
    for _, other in sorted(candidates, reverse=True):
        if checkpoint_problem(other) is None:
            return other
    return None


def unreadable_checkpoint_message(path: str | Path, reason: str) -> str:
    """``CHECKPOINT: reason; resume from PREVIOUS instead`` (or what to do without one)."""
    previous = previous_good_checkpoint(path)
    hint = (f'resume from the previous checkpoint instead: --resume {previous}'
            if previous is not None else
            f'no earlier checkpoint in {Path(path).parent} looks whole; start without --resume')
    return f'cannot load checkpoint {path}: {reason}; {hint}'
