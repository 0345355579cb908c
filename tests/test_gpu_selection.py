"""Every test that needs CUDA is selected by ``make test-gpu`` and ``tools/gpu_run.sh``.

Both select the tests marked ``gpu`` in every module that carries the marker. A test that
skipped itself for want of CUDA (``skipif(not torch.cuda.is_available())``, or
``pytest.skip`` under such a check) would be selected by neither and never run on a GPU;
tests/conftest.py skips marked tests without CUDA, with the reason.
"""

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cuda_absent_checks(tree: ast.AST) -> list[int]:
    """Lines of ``not torch.cuda.is_available()`` (or ``torch.cuda.device_count() == 0``)
    used as a skip condition: in a ``skipif`` decorator or an ``if`` whose body skips."""
    lines = []

    def needs_cuda(node: ast.AST) -> bool:
        src = ast.unparse(node).replace(' ', '')
        return 'notcuda.is_available()' in src.replace('torch.', '') or \
            'cuda.device_count()==0' in src or 'cuda.device_count()<1' in src

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith('skipif') and \
                node.args and needs_cuda(node.args[0]):
            lines.append(node.lineno)
        if isinstance(node, ast.If) and needs_cuda(node.test) and any(
                isinstance(n, ast.Call) and ast.unparse(n.func).endswith('skip')
                for stmt in node.body for n in ast.walk(stmt)):
            lines.append(node.lineno)
    return lines


def test_no_test_skips_for_want_of_cuda_outside_the_gpu_marker():
    found = []
    for path in sorted((ROOT / 'tests').rglob('*.py')):
        for line in _cuda_absent_checks(ast.parse(path.read_text(), str(path))):
            found.append(f'{path.relative_to(ROOT)}:{line}')
    assert not found, ('these tests skip themselves without CUDA, so the GPU runs never '
                       'select them: mark them @pytest.mark.gpu instead (tests/conftest.py '
                       'skips those without CUDA):\n' + '\n'.join(found))


def test_the_scan_finds_a_hand_written_cuda_skip():
    tree = ast.parse('import pytest, torch\n'
                     '@pytest.mark.skipif(not torch.cuda.is_available(), reason="gpu")\n'
                     'def test_a(): pass\n'
                     'def test_b():\n'
                     '    if not torch.cuda.is_available():\n'
                     '        pytest.skip("gpu")\n')
    assert _cuda_absent_checks(tree) == [2, 5]


def test_make_test_gpu_selects_every_marked_module():
    out = subprocess.run(['make', '-s', '--no-print-directory', '-f', 'Makefile', '-f', '-',
                          'print-gpu-tests'], input='print-gpu-tests:\n\t@echo $(GPU_TESTS)\n',
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    selected = set(out.split())
    marked = {str(p.relative_to(ROOT)) for p in (ROOT / 'tests').rglob('test_*.py')
              if 'pytest.mark.gpu' in p.read_text()}
    assert marked <= selected, marked - selected
    assert 'tests/test_rollout/test_lmdeploy_ipc_cuda.py' in selected
    assert 'tests/test_advantage/test_edge_cases.py' in selected
