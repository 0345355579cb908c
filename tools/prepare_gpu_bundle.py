"""Wheels for a GPU machine without network: ``python tools/prepare_gpu_bundle.py [--out DIR]``.

Downloads the packages of ``requirements-gpu-bundle.txt`` (what the GPU image lacks for
``make test-gpu`` and LMDeploy's PyTorch engine) as wheels for CPython 3.12 on manylinux
x86_64, whatever this machine runs, with ``pip download --no-deps``; strips TurboMind's
compiled library out of LMDeploy's wheel (the PyTorch engine never loads it); builds this
project's wheel; and prints every wheel's size, the total and whether it stays under the
limit of what one command may carry (64 MiB by default), with the working tree counted.

The stripped LMDeploy wheel is a valid wheel: the same name and metadata, the removed
files gone from its ``RECORD``, so ``pip install`` checks the rest as usual. Install on the
GPU machine with ``pip install --no-index --no-deps --target DIR DIR_OF_WHEELS/*.whl``
(``tools/gpu_run.sh``).
"""

import argparse
import fnmatch
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / 'requirements-gpu-bundle.txt'
PLATFORMS = ('manylinux_2_28_x86_64', 'manylinux_2_27_x86_64', 'manylinux_2_17_x86_64',
             'manylinux2014_x86_64', 'manylinux1_x86_64')
# LMDeploy's TurboMind engine: its compiled library and the static library beside it
# (about 380 MB unpacked, most of the 107 MB wheel); the PyTorch engine imports neither.
STRIP = {'lmdeploy': ('lmdeploy/turbomind/_turbomind*.so', 'lmdeploy/turbomind/lib64/*')}


def requirements(path: Path) -> list[str]:
    """The ``name==version`` lines of a requirements file (comments and blanks dropped).

    Raises:
        ValueError: a line that does not pin one version (the bundle must be reproducible).
    """
    out = []
    for number, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1):
        line = line.split('#', 1)[0].strip()
        if not line:
            continue
        if line.count('==') != 1 or any(c in line for c in '<>;[ '):
            raise ValueError(f'{path}:{number}: {line!r} must be NAME==VERSION')
        out.append(line)
    return out


def download(specs: list[str], dest: Path, python_version: str) -> None:
    """``pip download --no-deps`` of binary wheels for CPython ``python_version`` x86_64."""
    platforms = [arg for p in PLATFORMS for arg in ('--platform', p)]
    subprocess.run([sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary=:all:',
                    '--python-version', python_version, '--implementation', 'cp', *platforms,
                    '-d', str(dest), *specs], check=True)


def strip_wheel(wheel: Path, patterns: tuple[str, ...]) -> list[str]:
    """Rewrites ``wheel`` in place without the members matching ``patterns`` (fnmatch), and
    without their lines in ``*.dist-info/RECORD``. Returns the removed names.

    Raises:
        ValueError: no member matched (the wheel's layout changed: check the patterns).
    """
    tmp = wheel.with_name(wheel.name + '.tmp')
    removed: list[str] = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, 'w', zipfile.ZIP_DEFLATED) as dst:
        names = src.namelist()
        drop = {n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns)}
        if not drop:
            tmp.unlink()
            raise ValueError(f'{wheel.name}: nothing matches {patterns}')
        for info in src.infolist():
            if info.filename in drop:
                removed.append(info.filename)
                continue
            data = src.read(info)
            if info.filename.endswith('.dist-info/RECORD'):
                lines = data.decode('utf-8').splitlines(keepends=True)
                data = ''.join(line for line in lines
                               if line.split(',', 1)[0] not in drop).encode('utf-8')
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    tmp.replace(wheel)
    return sorted(removed)


def build_project_wheel(dest: Path) -> Path:
    """This project's wheel (with the transformers-5 start-up hook) into ``dest``."""
    for old in dest.glob('gepo_xtuner-*.whl'):
        old.unlink()
    subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation',
                    '-w', str(dest), str(ROOT)], check=True)
    shutil.rmtree(ROOT / 'build', ignore_errors=True)
    return next(dest.glob('gepo_xtuner-*.whl'))


def tracked_bytes() -> int:
    """Bytes of the files git tracks in this checkout (what travels besides the bundle)."""
    files = subprocess.run(['git', 'ls-files', '-z'], cwd=ROOT, capture_output=True,
                           check=True).stdout.split(b'\0')
    return sum((ROOT / f.decode()).stat().st_size for f in files
               if f and (ROOT / f.decode()).is_file())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--out', default=str(ROOT / '.gpu_bundle'), help='folder of the wheels')
    p.add_argument('--requirements', default=str(REQUIREMENTS))
    p.add_argument('--python-version', default='3.12')
    p.add_argument('--limit-mib', type=float, default=64.0)
    a = p.parse_args(argv)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    specs = requirements(Path(a.requirements))
    for name in STRIP:  # stripped by an earlier run: fetch the published wheel again
        for wheel in out.glob(f'{name}-*.whl'):
            wheel.unlink()
    download(specs, out, a.python_version)
    for name, patterns in STRIP.items():
        for wheel in out.glob(f'{name}-*.whl'):
            before = wheel.stat().st_size
            removed = strip_wheel(wheel, patterns)
            print(f'stripped {wheel.name}: {before / 2**20:.1f} -> '
                  f'{wheel.stat().st_size / 2**20:.1f} MiB ({len(removed)} files: '
                  f'{", ".join(removed)})')
    build_project_wheel(out)
    wheels = sorted(out.glob('*.whl'), key=lambda w: -w.stat().st_size)
    names = {w.name.split('-')[0].lower().replace('_', '-') for w in wheels}
    wanted = {s.split('==')[0].lower().replace('_', '-') for s in specs} | {'gepo-xtuner'}
    if stale := sorted(names - wanted):
        print(f'note: {out} also holds wheels not in the list: {", ".join(stale)} (remove them '
              'or they are installed too)')
    total = sum(w.stat().st_size for w in wheels)
    tree = tracked_bytes()
    for wheel in wheels:
        print(f'{wheel.stat().st_size / 2**20:8.2f} MiB  {wheel.name}')
    under = total + tree <= a.limit_mib * 2**20
    print(f'total {total / 2**20:.2f} MiB in {len(wheels)} wheels; with the tracked files '
          f'({tree / 2**20:.2f} MiB) {(total + tree) / 2**20:.2f} MiB: '
          f'{"under" if under else "OVER"} the {a.limit_mib:g} MiB limit')
    return 0 if under else 1


if __name__ == '__main__':
    sys.exit(main())
