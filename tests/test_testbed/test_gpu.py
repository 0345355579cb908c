"""The GPU checks' logic on the CPU (``gepo_xtuner.testbed.gpu``): comparisons, tolerances,
the packed/padded and rollout/trainer checks run for real in fp32 and bf16, the FLOP
count, the report, and ``make test-gpu`` skipping with the reason where there is no CUDA."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gepo_xtuner.model.packing import PACKED_ATTENTION, packed_attention
from gepo_xtuner.model.policy import RLPolicy
from gepo_xtuner.testbed.gpu import (TOLERANCES, Tolerance, compare, format_report,
                                     grad_agreement, packed_vs_padded, peak_bf16_tflops,
                                     read_report, record, rollout_vs_trainer, step_flops)
from gepo_xtuner.testbed.rl_step import build_qwen2, workload
from gepo_xtuner.testbed.tiny import build_char_tokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope='module')
def sharp_dir(tmp_path_factory) -> Path:
    """The GPU tests' tiny model (tests/test_gpu/conftest.py): peaked, context-dependent
    logits from ``initializer_range=0.2``."""
    out = tmp_path_factory.mktemp('sharp')
    build_qwen2(out, len(build_char_tokenizer()), 128, 2, heads=4, initializer_range=0.2)
    return out


def test_compare_bounds_each_element_and_refuses_non_finite_values():
    ref = torch.tensor([-1.0, -10.0, 0.0])
    tol = Tolerance(atol=0.1, rtol=0.05)
    # bound per element: 0.15, 0.6, 0.1
    assert compare('x', ref + torch.tensor([0.14, -0.59, 0.09]), ref, tol).ok
    out = compare('x', ref + torch.tensor([0.0, 0.0, 0.11]), ref, tol)
    assert not out.ok and out.worst == pytest.approx(1.1) and 'OUT OF TOLERANCE' in str(out)
    assert compare('x', ref + torch.tensor([0.0, 0.0, 5.0]), ref, tol,
                   mask=torch.tensor([True, True, False])).ok
    assert not compare('x', torch.tensor([float('nan'), -10.0, 0.0]), ref, tol).ok
    with pytest.raises(ValueError, match='shapes differ'):
        compare('x', ref[:2], ref, tol)
    with pytest.raises(ValueError, match='nothing to compare'):
        compare('x', ref, ref, tol, mask=torch.zeros(3, dtype=torch.bool))


def test_grad_agreement():
    a = [torch.tensor([1.0, 0.0]), None, torch.tensor([2.0])]
    assert grad_agreement(a, a)['cosine'] == pytest.approx(1.0)
    assert grad_agreement(a, a)['rel_l2'] == 0.0
    flipped = grad_agreement(a, [torch.tensor([-1.0, 0.0]), None, torch.tensor([-2.0])])
    assert flipped['cosine'] == pytest.approx(-1.0) and flipped['rel_l2'] == pytest.approx(2.0)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_packed_vs_padded_agree_on_cpu(sharp_dir, dtype):
    batch, _ = workload(8, median=12, sigma=0.9, max_len=40, vocab=50, seed=1)
    result = packed_vs_padded(sharp_dir, batch, 'cpu', dtype)
    assert result['attention'] == 'SDPA per sequence'
    for key in ('logprobs', 'entropies', 'packed_vs_fp32', 'padded_vs_fp32'):
        assert result[key].ok, str(result[key])
    assert result['grads']['cosine'] >= result['grads']['cosine_min']


def _leaky(module, query, key, value, attention_mask, **kwargs):
    """Packed calls attend over the whole row (across sequences): a packing bug."""
    from gepo_xtuner.model.packing import cu_seqlens_of
    cu = cu_seqlens_of(attention_mask)
    if cu is None:
        return packed_attention(module, query, key, value, attention_mask, **kwargs)
    rows = torch.zeros_like(cu[:2])
    rows[1] = cu[-1]
    return packed_attention(module, query, key, value, rows.view(1, 1, 1, -1), **kwargs)


def test_the_bf16_tolerance_catches_a_sequence_that_sees_its_neighbour(sharp_dir):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    policy = RLPolicy(str(sharp_dir), dict(type='CISPOLoss'), torch_dtype='bfloat16',
                      packing='on')
    batch, _ = workload(8, median=12, sigma=0.9, max_len=40, vocab=50, seed=1)
    inputs = {k: getattr(batch, k) for k in ('input_ids', 'attention_mask', 'response_mask')}
    name = f'{PACKED_ATTENTION}:sdpa'
    def put(fn):  # transformers < 4.50: a plain dict; later an AttentionInterface
        if hasattr(ALL_ATTENTION_FUNCTIONS, 'register'):
            ALL_ATTENTION_FUNCTIONS.register(name, fn)
        else:
            ALL_ATTENTION_FUNCTIONS[name] = fn

    put(_leaky)
    try:
        with torch.no_grad():
            leaked, _ = policy.response_logprobs(inputs, packed=True)
            padded, _ = policy.response_logprobs(inputs, packed=False)
    finally:
        put(packed_attention)
    out = compare('leaky packed vs padded', leaked, padded,
                  TOLERANCES[torch.bfloat16]['logprobs'], inputs['response_mask'])
    assert not out.ok and out.max_abs > 1.0, str(out)


def test_rollout_logprobs_match_the_trainer_on_cpu(sharp_dir):
    policy = RLPolicy(str(sharp_dir), dict(type='CISPOLoss'))
    torch.manual_seed(0)
    result = rollout_vs_trainer(policy, [[1, 5, 6, 7], [1, 8, 9, 10, 11, 12]], 8)
    assert result['generated_tokens'] == 16
    assert result['logprobs'].ok, str(result['logprobs'])
    assert result['tokens_per_s'] > 0


def test_peak_and_flops():
    assert peak_bf16_tflops('NVIDIA H100 80GB HBM3') == 989.0
    assert peak_bf16_tflops('NVIDIA H200') == 989.0
    assert peak_bf16_tflops('NVIDIA H100 PCIe') == 756.0
    assert peak_bf16_tflops('cpu') is None
    params, layers, width, lengths = 1000, 3, 8, [5, 1, 7]
    # brute force: 2 FLOPs per parameter and token; QK^T and PV: 2 * 2 * width per attended
    # position, token t (1-based) of a sequence attends to t positions, in every layer
    forward = sum(2 * params * n + sum(4 * width * t * layers for t in range(1, n + 1))
                  for n in lengths)
    assert step_flops(params, layers, width, lengths) == 4 * forward


def test_record_and_report(tmp_path):
    record('a', {'x': 1.5, 'nested': {'y': 2}}, report_dir=tmp_path)
    cmp = compare('c', torch.zeros(2), torch.zeros(2), Tolerance(0.1, 0.0))
    record('b', {'cmp': cmp}, report_dir=tmp_path)
    rows = read_report(tmp_path / 'report.jsonl')
    assert [r['check'] for r in rows] == ['a', 'b'] and rows[1]['cmp']['ok'] is True
    text = format_report(rows)
    assert '== a' in text and 'nested.y: 2' in text and 'cmp.max_abs: 0' in text
    assert 'no GPU figures' in format_report([])


@pytest.mark.skipif(torch.cuda.is_available(), reason='with CUDA it would run the GPU tests')
def test_make_test_gpu_skips_with_the_reason_and_succeeds_without_cuda(tmp_path):
    proc = subprocess.run(['make', '-s', 'test-gpu', f'PY={sys.executable}',
                           f'GPU_REPORT_DIR={tmp_path}'], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert 'needs CUDA: ' in out and ' passed' not in out and 'skipped' in out, out[-4000:]
    assert 'no GPU figures recorded' in out, out[-2000:]
