"""Third-party notices that tell the user nothing stay out of the console of the entry points.

bitsandbytes (installed with xtuner 0.2.0) is imported by ``mmengine.optim`` in every
process that trains or uses the package, and on a machine without CUDA it logs that its
CPU build has no GPU support. These tests run real entry points in fresh processes.
"""

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import _gepo_xtuner_quiet as quiet

ROOT = Path(__file__).resolve().parents[1]
NOTICE = 'bitsandbytes was compiled without GPU support'
no_gpu = pytest.mark.skipif(torch.cuda.is_available(),
                            reason='with a GPU the notice is kept (it then matters)')


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


@no_gpu
def test_a_tool_prints_no_bitsandbytes_cpu_notice():
    proc = run('tools/run_experiments.py', '--help')
    assert proc.returncode == 0 and 'usage: run_experiments.py' in proc.stdout, proc.stderr
    assert NOTICE not in proc.stdout + proc.stderr


@no_gpu
def test_importing_bitsandbytes_without_the_hook_prints_the_notice():
    """The check above can fail: this bitsandbytes does print the notice on this machine."""
    proc = run('-c', 'import _gepo_xtuner_quiet as q; q.uninstall(); import mmengine.optim')
    assert proc.returncode == 0, proc.stderr
    assert NOTICE in proc.stderr


def record(message: str) -> logging.LogRecord:
    return logging.LogRecord(quiet.LOGGER, logging.WARNING, 'cextension.py', 78, message,
                             None, None)


def test_the_notice_is_dropped_only_without_cuda_and_nothing_else_is():
    cpu = quiet.CpuBuildNotice(cuda_available=lambda: False)
    gpu = quiet.CpuBuildNotice(cuda_available=lambda: True)
    notice = record(f'The installed version of {NOTICE}. 8-bit optimizers, 8-bit '
                    'multiplication, and GPU quantization are unavailable.')
    assert not cpu.filter(notice)
    assert gpu.filter(notice)  # a GPU that bitsandbytes cannot use: the user should know
    other = record('Could not find the bitsandbytes CUDA binary at %r')
    assert cpu.filter(other) and gpu.filter(other)


def test_the_hook_sets_the_filter_when_bitsandbytes_is_first_looked_up():
    proc = run('-c', 'import sys, logging, _gepo_xtuner_quiet as q\n'
                     'log = logging.getLogger(q.LOGGER)\n'
                     'print(any(isinstance(f, q.CpuBuildNotice) for f in log.filters))\n'
                     'import importlib.util; importlib.util.find_spec("bitsandbytes")\n'
                     'print(any(isinstance(f, q.CpuBuildNotice) for f in log.filters))\n'
                     'print("bitsandbytes" in sys.modules)')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ['False', 'True', 'False']  # set on lookup, nothing imported
