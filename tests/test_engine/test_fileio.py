"""AtomicLocalBackend: an interrupted write leaves the previous file intact."""

import os
from pathlib import Path

import pytest
from mmengine.fileio import get_file_backend

from gepo_xtuner.engine.state.fileio import AtomicLocalBackend


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


def test_stale_temporaries_are_only_the_backends_own_leftovers(tmp_path):
    import tempfile

    from gepo_xtuner.engine.state.fileio import remove_stale_temporaries, stale_temporaries
    fd, left = tempfile.mkstemp(prefix='.iter_4.pth.', suffix='.tmp', dir=tmp_path)  # as put()
    os.write(fd, b'x' * 1000)
    os.close(fd)
    fd, text = tempfile.mkstemp(prefix='.last_checkpoint.', suffix='.tmp', dir=tmp_path)
    os.close(fd)
    keep = ['iter_2.pth', '.iter_2.pth.tmp', 'notes.tmp', '.iter_2.pth.TOOLONGNAME.tmp',
            'last_checkpoint']
    for name in keep:
        (tmp_path / name).write_text('keep')
    assert stale_temporaries(tmp_path) == sorted([Path(left), Path(text)])
    assert remove_stale_temporaries(tmp_path) == sorted([(Path(left), 1000), (Path(text), 0)])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)
    assert stale_temporaries(tmp_path / 'absent') == []


def test_a_cut_off_checkpoint_is_named_with_the_previous_good_one(tmp_path):
    import torch

    from gepo_xtuner.engine.state.fileio import checkpoint_problem, unreadable_checkpoint_message
    for step in (2, 4, 6, 8):
        torch.save({'state_dict': {'w': torch.arange(1000.0)}, 'meta': {'iter': step}},
                   tmp_path / f'iter_{step}.pth')
    data = (tmp_path / 'iter_8.pth').read_bytes()
    (tmp_path / 'iter_8.pth').write_bytes(data[:len(data) // 2])  # killed during a copy
    (tmp_path / 'iter_6.pth').write_bytes(data[:100])
    (tmp_path / 'epoch_7.pth').write_bytes(b'')  # another kind: not a candidate
    assert checkpoint_problem(tmp_path / 'iter_4.pth') is None
    assert 'not a complete torch checkpoint' in checkpoint_problem(tmp_path / 'iter_8.pth')
    assert checkpoint_problem(tmp_path / 'epoch_7.pth') == 'the file is empty'
    message = unreadable_checkpoint_message(tmp_path / 'iter_8.pth', 'cut off')
    assert message == (f'cannot load checkpoint {tmp_path / "iter_8.pth"}: cut off; resume from '
                       f'the previous checkpoint instead: --resume {tmp_path / "iter_4.pth"}')
    assert unreadable_checkpoint_message(tmp_path / 'iter_2.pth', 'x').endswith(
        f'no earlier checkpoint in {tmp_path} looks whole; start without --resume')
