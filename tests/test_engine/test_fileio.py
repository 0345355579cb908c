"""AtomicLocalBackend: an interrupted write leaves the previous file intact."""

import pytest
from mmengine.fileio import get_file_backend

from gepo_xtuner.engine.fileio import AtomicLocalBackend


class Interrupted(Exception):
    pass



def test_put_replaces_atomically_and_cleans_up_on_failure(tmp_path, monkeypatch):
    backend = get_file_backend(str(tmp_path), backend_args=dict(backend='atomic_local'))
    assert isinstance(backend, AtomicLocalBackend)
    target = tmp_path / 'iter_1.pth'
    backend.put(b'old checkpoint', target)
    assert target.read_bytes() == b'old checkpoint'

    import os
    real_fsync = os.fsync

    def crash(fd):
        real_fsync(fd)
        raise Interrupted('killed after writing, before the rename')

    monkeypatch.setattr(os, 'fsync', crash)
    with pytest.raises(Interrupted):
        backend.put(b'new checkpoint that never completes', target)
    assert target.read_bytes() == b'old checkpoint'
    assert [p.name for p in tmp_path.iterdir()] == ['iter_1.pth']  # temp file removed

    monkeypatch.setattr(os, 'fsync', real_fsync)
    backend.put_text('new', target)
    assert target.read_text() == 'new'
