"""An mmengine file backend whose writes are atomic (temp file, fsync, rename)."""

import os
import tempfile
from pathlib import Path

from mmengine.fileio import LocalBackend, register_backend


@register_backend('atomic_local')
class AtomicLocalBackend(LocalBackend):
    """Local files, but a write never leaves a half-written file behind.

    ``put``/``put_text`` write to a temporary file in the destination directory,
    ``fsync`` it and ``os.replace`` it over the target, so a process killed while
    saving a checkpoint leaves the previous checkpoint (and any file of the same
    name) intact. Select it with ``backend_args=dict(backend='atomic_local')``,
    e.g. on mmengine's ``CheckpointHook``.
    """

    def put(self, obj: bytes, filepath: str | Path) -> None:
        self._atomic_write(filepath, obj)

    def put_text(self, obj: str, filepath: str | Path, encoding: str = 'utf-8') -> None:
        self._atomic_write(filepath, obj.encode(encoding))

    @staticmethod
    def _atomic_write(filepath: str | Path, data: bytes) -> None:
        path = Path(filepath)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f'.{path.name}.', suffix='.tmp', dir=path.parent)
        try:
            with os.fdopen(fd, 'wb') as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
