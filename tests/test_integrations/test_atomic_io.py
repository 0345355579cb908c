"""gepo_xtuner.atomic_io, the one writer of the integrations' state files: a write that is
interrupted leaves the previous file intact, and the integrations write through it."""

import ast
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from gepo_xtuner.atomic_io import (TEMP_NAME, atomic_write_bytes, atomic_write_json,
                                   atomic_write_text)
from gepo_xtuner.integrations.slime import BAND_FILE, GEPOPostProcess

ROOT = Path(__file__).resolve().parents[2]


class Interrupted(Exception):
    pass


def test_a_write_replaces_the_file_and_leaves_nothing_else(tmp_path):
    target = tmp_path / 'sub' / 'state.json'  # the directory is created
    assert atomic_write_json(target, {'a': [1, 2]}, indent=2) == target
    assert json.loads(target.read_text()) == {'a': [1, 2]}
    atomic_write_text(target, 'new')
    assert target.read_text() == 'new'
    assert [p.name for p in target.parent.iterdir()] == ['state.json']


@pytest.mark.parametrize('fail', ['os.replace', 'os.fsync', 'write'])
def test_an_interrupted_write_keeps_the_old_file_and_removes_its_temporary(
        tmp_path, monkeypatch, fail):
    target = tmp_path / 'gepo_state.json'
    atomic_write_bytes(target, b'old')
    if fail == 'write':
        real_fdopen = os.fdopen

        class Cut:
            """A file whose write stops halfway, as a full disk would."""

            def __init__(self, fh):
                self.fh = fh

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.fh.close()

            def write(self, data):
                self.fh.write(data[:len(data) // 2])
                raise Interrupted('cut off in the middle of the data')

        monkeypatch.setattr(os, 'fdopen', lambda fd, mode: Cut(real_fdopen(fd, mode)))
    else:
        def crash(*args):
            raise Interrupted(f'{fail} interrupted')

        monkeypatch.setattr(os, fail.split('.')[1], crash)
    with pytest.raises(Interrupted):
        atomic_write_bytes(target, b'new content that never lands')
    assert target.read_bytes() == b'old'
    assert [p.name for p in tmp_path.iterdir()] == ['gepo_state.json']


def test_an_object_json_cannot_encode_touches_nothing(tmp_path):
    target = tmp_path / 'state.json'
    atomic_write_json(target, {'ok': 1})
    with pytest.raises(TypeError):
        atomic_write_json(target, {'bad': object()})
    assert json.loads(target.read_text()) == {'ok': 1}
    assert [p.name for p in tmp_path.iterdir()] == ['state.json']


def test_a_process_killed_mid_write_leaves_the_old_file_and_a_recognisable_temporary(tmp_path):
    """SIGKILL after the data is written and before the rename: no handler runs, so the
    temporary stays, named so that the checkpoint clean-up recognises it."""
    target = tmp_path / 'gepo_state.json'
    atomic_write_json(target, {'band': 'old'})
    code = textwrap.dedent(f'''
        import os, signal
        from gepo_xtuner.atomic_io import atomic_write_json
        os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
        atomic_write_json({str(target)!r}, {{'band': 'new' * 100000}})
    ''')
    proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True,
                          timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert json.loads(target.read_text()) == {'band': 'old'}
    left = sorted(p.name for p in tmp_path.iterdir() if p != target)
    assert len(left) == 1 and TEMP_NAME.fullmatch(left[0])['target'] == target.name


def test_slime_band_file_keeps_its_lines_when_an_append_is_interrupted(tmp_path, monkeypatch):
    """slime's band history is rewritten whole: a cut-off save keeps every earlier line
    readable, where an in-place append could leave a partial last line."""
    processor = GEPOPostProcess()
    args = SimpleNamespace(save=str(tmp_path))
    processor._save(args)
    processor.state.num_updates = 1
    processor._save(args)
    before = (tmp_path / BAND_FILE).read_bytes()
    assert [json.loads(line)['num_updates'] for line in before.splitlines()] == [0, 1]

    def crash(*args):
        raise Interrupted('killed during the save')

    monkeypatch.setattr(os, 'replace', crash)
    processor.state.num_updates = 2
    with pytest.raises(Interrupted):
        processor._save(args)
    assert (tmp_path / BAND_FILE).read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [BAND_FILE]


#: Calls that write or move files; the integrations leave them to gepo_xtuner.atomic_io.
WRITE_CALLS = {'replace', 'rename', 'renames', 'write_text', 'write_bytes', 'fsync'}


def file_writes(source: str) -> list[str]:
    """``line: call`` of each file write of ``source`` not made through atomic_io:
    ``os.replace`` / ``os.rename`` / ``os.fsync``, ``Path.write_text`` / ``write_bytes`` /
    ``replace`` / ``rename`` (any ``<x>.<name>(`` of :data:`WRITE_CALLS` but
    ``str.replace`` of a string literal), and ``open`` with a mode that writes."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in WRITE_CALLS:
            if not (isinstance(func.value, ast.Constant) and isinstance(func.value.value, str)):
                found.append(f'{node.lineno}: .{func.attr}(')
        elif isinstance(func, ast.Name) and func.id == 'open':
            mode = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == 'mode'), None)
            if mode is not None and not (isinstance(mode, ast.Constant)
                                         and not set(str(mode.value)) & set('wax+')):
                found.append(f'{node.lineno}: open(..., {ast.unparse(mode)})')
    return found


def test_the_integrations_write_files_only_through_atomic_io():
    offenders = {}
    for path in sorted((ROOT / 'gepo_xtuner' / 'integrations').rglob('*.py')):
        hits = file_writes(path.read_text())
        if hits:
            offenders[str(path.relative_to(ROOT))] = hits
    assert not offenders, offenders


@pytest.mark.parametrize('source, hits', [
    ("os.replace(a, b)", 1), ("Path(p).write_text('x')", 1), ("open(p, 'a')", 1),
    ("open(p, mode='wb')", 1), ("open(p, m)", 1), ("open(p)", 0),
    ("open(p, encoding='utf-8')", 0), ("'a-b'.replace('-', '_')", 0),
])
def test_the_write_finder_finds_each_form(source, hits):
    assert len(file_writes(source)) == hits
