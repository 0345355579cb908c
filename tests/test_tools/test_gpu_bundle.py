"""``tools/prepare_gpu_bundle.py``'s wheel stripping and requirement parsing, and
``tools/gpu_run.sh``'s refusals (the downloads and the GPU stages need the registry or a GPU)."""

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / 'tools'))

from prepare_gpu_bundle import STRIP, requirements, strip_wheel  # noqa: E402


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()
    return f'{name},sha256={digest},{len(data)}\n'


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    """A wheel of package ``lmdeploy`` 0.0.1 holding ``files`` (name -> content)."""
    info = 'lmdeploy-0.0.1.dist-info'
    files = {**files, f'{info}/METADATA': b'Metadata-Version: 2.1\nName: lmdeploy\n'
             b'Version: 0.0.1\n',
             f'{info}/WHEEL': b'Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n'
             b'Tag: py3-none-any\n'}
    record = ''.join(_record_line(n, d) for n, d in files.items()) + f'{info}/RECORD,,\n'
    wheel = path / 'lmdeploy-0.0.1-py3-none-any.whl'
    with zipfile.ZipFile(wheel, 'w') as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f'{info}/RECORD', record)
    return wheel


def test_strip_wheel_drops_turbomind_and_its_record_lines_and_stays_installable(tmp_path):
    wheel = _wheel(tmp_path, {'lmdeploy/__init__.py': b'VERSION = 1\n',
                              'lmdeploy/turbomind/_turbomind.cpython-312-x86_64-linux-gnu.so':
                              b'\0' * 4096,
                              'lmdeploy/turbomind/lib64/libxgrammar.a': b'\0' * 1024,
                              'lmdeploy/turbomind/__init__.py': b''})
    removed = strip_wheel(wheel, STRIP['lmdeploy'])
    assert removed == ['lmdeploy/turbomind/_turbomind.cpython-312-x86_64-linux-gnu.so',
                       'lmdeploy/turbomind/lib64/libxgrammar.a']
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        record = z.read('lmdeploy-0.0.1.dist-info/RECORD').decode()
    assert 'lmdeploy/turbomind/__init__.py' in names and not any('.so' in n for n in names)
    assert '_turbomind' not in record and 'libxgrammar' not in record
    assert 'lmdeploy/__init__.py,sha256=' in record
    target = tmp_path / 'site'
    proc = subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-index',
                           '--no-deps', '--target', str(target), str(wheel)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (target / 'lmdeploy' / '__init__.py').exists()
    with pytest.raises(ValueError, match='nothing matches'):
        strip_wheel(wheel, STRIP['lmdeploy'])


def test_requirements_must_pin_one_version(tmp_path):
    path = tmp_path / 'req.txt'
    path.write_text('# comment\nfoo==1.0  # why\n\nbar>=2\n')
    with pytest.raises(ValueError, match=r'req.txt:4: .*bar>=2.* must be NAME==VERSION'):
        requirements(path)
    path.write_text('foo==1.0  # why\n')
    assert requirements(path) == ['foo==1.0']
    assert 'lmdeploy==0.18.0' in requirements(ROOT / 'requirements-gpu-bundle.txt')


def test_gpu_run_refuses_without_a_stage_or_wheels(tmp_path):
    script = str(ROOT / 'tools' / 'gpu_run.sh')
    proc = subprocess.run([script], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and 'usage: tools/gpu_run.sh' in proc.stderr
    env = dict(os.environ, GPU_BUNDLE=str(tmp_path / 'empty'), GPU_SITE=str(tmp_path / 'site'),
               GEPO_GPU_REPORT_DIR=str(tmp_path / 'report'))
    proc = subprocess.run([script, 'check'], capture_output=True, text=True, env=env,
                          check=False)
    assert proc.returncode == 2 and 'run tools/prepare_gpu_bundle.py' in proc.stderr
