"""The transformers-5 start-up hook (_gepo_xtuner_transformers5.py, docs/transformers5.md).

Unit tests: it adds only names a module lacks, does nothing on the pinned
transformers 4.48, fires once on ``import xtuner.utils``, and both wheels
(``pip install .`` and ``pip install -e .``) install it. Integration tests: real
``python -m xtuner.tools.train`` RL runs of a tiny Qwen2 and a tiny Qwen3.5 with
transformers 5 from the overlay of ``make tf5-deps`` first on PYTHONPATH (installed
by the session fixture if missing; skipped only when the package registry cannot
be reached).
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
import transformers
import transformers.utils

import _gepo_xtuner_transformers5 as hook

from tests import preloaded

from .test_engine.conftest import FAST, scalars

ROOT = Path(__file__).resolve().parents[1]
TF5_DEPS = ROOT / 'work_dirs' / 'tf5_deps'
HOOK_NAME = '_XtunerImportHook'
TF4 = int(transformers.__version__.split('.')[0]) < 5


def run_python(code: str, overlay: Path | None = None, python: str = sys.executable,
               timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -c code`` with the repository (and the overlay first) on PYTHONPATH."""
    path = [str(overlay)] if overlay else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, str(ROOT)]), OMP_NUM_THREADS='1')
    return subprocess.run([python, '-c', textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=timeout, check=False)


# ----------------------------------------------------------------------------- unit tests

def test_adds_only_missing_names_and_never_replaces(monkeypatch):
    module = types.ModuleType('third_party_utils')
    original, replacement, missing = object(), object(), object()
    module.present = original
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(hook, 'REMOVED_NAMES',
                        {module.__name__: {'present': replacement, 'absent': missing}})
    monkeypatch.setattr(hook, 'provided', [])
    assert hook.provide_removed_names() == ['third_party_utils.absent']
    assert module.present is original and module.absent is missing
    assert hook.provide_removed_names() == []  # second call: nothing left to add
    assert hook.provided == ['third_party_utils.absent']


def test_unimportable_module_is_left_to_its_importer(monkeypatch):
    monkeypatch.setattr(hook, 'REMOVED_NAMES', {'no_such_module_xyz.utils': {'f': len}})
    assert hook.provide_removed_names() == []


def test_installed_transformers_keeps_its_own_names(monkeypatch):
    """On transformers 4.x every name exists: nothing is added or replaced."""
    monkeypatch.setattr(hook, 'provided', [])
    before = {n: getattr(transformers.utils, n, None)
              for n in hook.REMOVED_NAMES['transformers.utils']}
    added = hook.provide_removed_names()
    for name, obj in before.items():
        if obj is not None:
            assert getattr(transformers.utils, name) is obj, name
    assert set(added) == {f'transformers.utils.{n}' for n, o in before.items() if o is None}
    if TF4:
        assert added == []


@pytest.mark.skipif(not TF4, reason='compares with the function transformers 4.x has')
def test_is_safetensors_available_agrees_with_transformers_4():
    assert hook.is_safetensors_available() is transformers.utils.is_safetensors_available()


def test_startup_hook_waits_for_xtuner_utils_and_fires_once():
    """In this environment: installed at start-up, untouched by ``import xtuner``."""
    proc = run_python(f"""
        import sys, json
        import _gepo_xtuner_transformers5 as hook
        def hooked():
            return sum(type(f).__name__ == {HOOK_NAME!r} for f in sys.meta_path)
        seen = [hooked()]
        import xtuner
        seen.append(hooked())
        seen.append('transformers' in sys.modules)
        import xtuner.utils
        seen.append(hooked())
        print(json.dumps(dict(seen=seen, provided=hook.provided)))
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out['seen'][0] == 1, ('the start-up hook is not installed in this environment: '
                                 'reinstall the package (pip install -e .)')
    assert out['seen'][1:] == [1, False, 0]  # xtuner alone: no trigger, no transformers import
    if TF4:
        assert out['provided'] == []


def _copy_sources(dest: Path) -> Path:
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        '.venv', 'work_dirs', '.git', 'build', 'dist', '*.egg-info', '__pycache__',
        '.pytest_cache', 'tests'))
    return dest


def _wheel_members(wheel: Path) -> dict[str, bytes]:
    import zipfile
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist() if '/' not in n}


@pytest.mark.parametrize('kind', ['wheel', 'editable'])
def test_both_wheels_install_the_startup_hook(tmp_path, kind):
    """``pip install .`` and ``pip install -e .`` both put the .pth into site-packages."""
    pytest.importorskip('setuptools', reason='builds the wheels with setuptools.build_meta')
    src = _copy_sources(tmp_path / 'src')
    build = subprocess.run(
        [sys.executable, '-c',
         f'import sys; from setuptools import build_meta as b; print(b.build_{kind}(sys.argv[1]))',
         str(tmp_path / 'dist')],
        cwd=src, capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-3000:]
    wheel = tmp_path / 'dist' / build.stdout.split()[-1]
    top = _wheel_members(wheel)
    line = top['gepo_xtuner_transformers5.pth'].decode()
    assert line == 'import _gepo_xtuner_transformers5; _gepo_xtuner_transformers5.install()\n'
    assert top['gepo_xtuner_quiet.pth'].decode() == (
        'import _gepo_xtuner_quiet; _gepo_xtuner_quiet.install()\n')
    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True,
                   timeout=120)
    python = venv / 'bin' / 'python'
    install = subprocess.run(
        [sys.executable, '-m', 'pip', '--python', str(python), 'install', '--no-deps',
         '--no-index', str(wheel)], capture_output=True, text=True, timeout=300, check=False)
    assert install.returncode == 0, install.stderr[-3000:]
    probe = subprocess.run(
        [str(python), '-c', 'import sys; print([type(f).__name__ for f in sys.meta_path])'],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False,
        env={k: v for k, v in os.environ.items() if k != 'PYTHONPATH'})
    assert probe.returncode == 0, probe.stderr
    assert HOOK_NAME in probe.stdout and '_BitsandbytesLookupHook' in probe.stdout, probe.stdout


# ---------------------------------------------------------- transformers 5 (real overlay)

def test_overlay_is_transformers_5_and_xtuner_needs_the_hook(tf5_deps):
    """Without the hook, xtuner's import fails on transformers 5: the hook is not a no-op."""
    proc = run_python("""
        import _gepo_xtuner_transformers5 as hook
        hook.uninstall()
        import transformers
        print(transformers.__version__)
        import xtuner.utils
    """, overlay=tf5_deps)
    assert proc.stdout.startswith('5.'), proc.stdout + proc.stderr[-2000:]
    assert proc.returncode != 0
    assert "cannot import name 'is_safetensors_available'" in proc.stderr


def tiny_dir(kind: str, out: Path, overlay: Path) -> Path:
    proc = preloaded.run(
        [sys.executable, '-m', 'tests.transformers5_plugins', kind, str(out)], cwd=ROOT,
        capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, PYTHONPATH=f'{overlay}{os.pathsep}{ROOT}', OMP_NUM_THREADS='1'))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def train_tf5(tmp_path: Path, tiny: Path, work_dir: Path, overlay: Path,
              *options: str) -> subprocess.CompletedProcess:
    """``python -m xtuner.tools.train`` of the tiny GEPO config with the overlay first."""
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(textwrap.dedent(f"""
        _base_ = ['{ROOT / 'configs' / 'gepo_tiny_cpu.py'}']
        custom_imports = dict(imports=['gepo_xtuner', 'tests.test_engine.plugins',
                                       'tests.transformers5_plugins'],
                              allow_failed_imports=False)
        custom_hooks = [dict(type='TrainingCurvesHook'), dict(type='StackProbeHook')]
    """))
    env = dict(os.environ, GEPO_TINY_DIR=str(tiny), PYTHONPATH=f'{overlay}{os.pathsep}{ROOT}',
               OMP_NUM_THREADS='1')
    proc = preloaded.run(
        [sys.executable, '-m', 'xtuner.tools.train', str(cfg), '--work-dir', str(work_dir),
         '--cfg-options', *FAST, *options], capture_output=True, text=True, env=env, cwd=ROOT,
        timeout=600, check=False)
    assert proc.returncode == 0, f'exit {proc.returncode}\n{proc.stderr[-6000:]}'
    return proc


def probe(work_dir: Path) -> dict:
    return json.loads((work_dir / 'stack_probe.json').read_text())


def test_xtuner_train_rl_and_resume_on_transformers_5(tmp_path, tf5_deps):
    tiny = tiny_dir('qwen2', tmp_path / 'tiny', tf5_deps)
    full, resumed = tmp_path / 'full', tmp_path / 'resumed'
    train_tf5(tmp_path, tiny, full, tf5_deps, 'train_cfg.max_steps=4')
    got = probe(full)
    assert got['transformers'].startswith('5.')
    assert got['provided'] == ['transformers.utils.is_safetensors_available']
    assert got['model_class'] == 'Qwen2ForCausalLM' and got['changed'] > 0
    logged = scalars(full)
    assert set(range(1, 5)) <= set(logged)
    assert any(0 < logged[s]['reward/mean'] < 1 for s in range(1, 5))  # a learning signal
    train_tf5(tmp_path, tiny, resumed, tf5_deps, 'train_cfg.max_steps=4', '--resume',
              str(full / 'iter_2.pth'))
    again = scalars(resumed)
    assert 1 not in again and 2 not in again
    for step in (3, 4):
        for key in ('reward/mean', 'loss/pg', 'gepo/h_low', 'gepo/h_high', 'entropy/policy'):
            assert again[step][key] == logged[step][key], (step, key)
    end_full = torch.load(full / 'iter_4.pth', map_location='cpu', weights_only=False)
    end_resumed = torch.load(resumed / 'iter_4.pth', map_location='cpu', weights_only=False)
    torch.testing.assert_close(end_full['state_dict'], end_resumed['state_dict'], rtol=0, atol=0)


def test_xtuner_train_rl_qwen3_5_on_transformers_5(tmp_path, tf5_deps):
    """A tiny Qwen3.5 checkpoint (multimodal layout) trained as a text policy.

    ``RLPolicy``'s default ``AutoModelForCausalLM`` maps model_type ``qwen3_5`` to
    the text-only ``Qwen3_5ForCausalLM`` (the vision tower's weights are skipped).
    """
    tiny = tiny_dir('qwen3_5', tmp_path / 'tiny', tf5_deps)
    assert json.loads((tiny / 'model' / 'config.json').read_text())['model_type'] == 'qwen3_5'
    work = tmp_path / 'run'
    train_tf5(tmp_path, tiny, work, tf5_deps, 'train_cfg.max_steps=3')
    got = probe(work)
    assert got['transformers'].startswith('5.')
    assert got['model_class'] == 'Qwen3_5ForCausalLM'
    assert got['changed'] > 0, 'no parameter moved'
    logged = scalars(work)
    assert set(range(1, 4)) <= set(logged)
    assert all(torch.isfinite(torch.tensor(logged[s]['loss/pg'])) for s in range(1, 4))
