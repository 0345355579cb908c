"""What the GPU checks (``make test-gpu``, ``tests/test_gpu``) compare, and the figures they
report; the same code runs on the CPU in the unit tests (``tests/test_testbed/test_gpu.py``).

* :func:`compare` / :class:`Tolerance`: elementwise agreement of a CUDA result with its
  reference (an fp32 pass, or the other code path), ``|a - r| <= atol + rtol * |r|``.
* :func:`grad_agreement`: cosine and relative L2 distance of two gradients.
* :func:`packed_vs_padded`: logprobs, entropies and gradients of the packed and the padded
  trainer passes of an ``RLPolicy``, each also against an fp32 pass of the padded path.
* :func:`rollout_vs_trainer`: ``HFRolloutBackend``'s sampled logprobs against the trainer's
  scoring of the same tokens.
* :func:`peak_bf16_tflops`, :func:`step_flops`: MFU's denominator and numerator.
* :func:`record` / :func:`read_report`: one JSON line per check under ``work_dirs/gpu``.
"""

import json
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ['Tolerance', 'Comparison', 'TOLERANCES', 'compare', 'grad_agreement',
           'packed_vs_padded', 'rollout_vs_trainer', 'PEAK_BF16_TFLOPS', 'peak_bf16_tflops',
           'step_flops', 'device_summary', 'record', 'read_report', 'format_report',
           'REPORT_DIR']

REPORT_DIR = Path(os.environ.get('GEPO_GPU_REPORT_DIR', 'work_dirs/gpu'))


@dataclass(frozen=True)
class Tolerance:
    """``|actual - reference| <= atol + rtol * |reference|`` elementwise."""

    atol: float
    rtol: float


# Per-token logprobs and entropies (nats). bf16 keeps 8 significant bits (unit roundoff
# 2^-8 = 0.0039): a logit of magnitude ~10 is off by ~0.04 after one rounding, and a
# 24-layer residual stream accumulates a few of them, so two bf16 paths that compute the
# same thing in a different order disagree by a few hundredths of a nat; 0.1 nat + 5 %
# leaves room for that and still catches a sequence that sees its neighbour (differences
# of several nats, see tests/test_testbed/test_gpu.py). 'vs_fp32' bounds a bf16 path against an
# fp32 pass on the same weights: every rounding of the bf16 path counts there (on CPU, 400
# tokens, bf16 SDPA: up to 0.37 nats on a 2-layer model), so it is wider, and still below
# the error of a sequence that sees the wrong context. fp32: reduction-order noise only.
TOLERANCES: dict[torch.dtype, dict[str, Tolerance]] = {
    torch.float32: {'logprobs': Tolerance(1e-4, 1e-4), 'entropies': Tolerance(1e-4, 1e-4),
                    'vs_fp32': Tolerance(1e-4, 1e-4)},
    torch.bfloat16: {'logprobs': Tolerance(0.1, 0.05), 'entropies': Tolerance(0.1, 0.05),
                     'vs_fp32': Tolerance(0.5, 0.1)},
    torch.float16: {'logprobs': Tolerance(0.05, 0.02), 'entropies': Tolerance(0.05, 0.02),
                    'vs_fp32': Tolerance(0.25, 0.05)},
}
# Gradients of the two paths: cosine similarity at least this, per dtype.
GRAD_COSINE = {torch.float32: 0.9999, torch.bfloat16: 0.99, torch.float16: 0.995}


@dataclass(frozen=True)
class Comparison:
    """Agreement of ``actual`` with ``reference`` over the compared elements.

    Attributes:
        name: what was compared.
        count: elements compared.
        max_abs, mean_abs: of ``|actual - reference|``.
        worst: ``max |actual - reference| / (atol + rtol * |reference|)``; <= 1 passes.
        atol, rtol: the tolerance.
    """

    name: str
    count: int
    max_abs: float
    mean_abs: float
    worst: float
    atol: float
    rtol: float

    @property
    def ok(self) -> bool:
        return self.worst <= 1.0

    def figures(self) -> dict[str, Any]:
        return {**asdict(self), 'ok': self.ok}

    def __str__(self) -> str:
        verdict = 'ok' if self.ok else 'OUT OF TOLERANCE'
        return (f'{self.name}: max |diff| {self.max_abs:.3g}, mean {self.mean_abs:.3g} over '
                f'{self.count} values; worst {self.worst:.3g} of the tolerance '
                f'(atol {self.atol:g}, rtol {self.rtol:g}): {verdict}')


def compare(name: str, actual: Tensor, reference: Tensor, tol: Tolerance,
            mask: Tensor | None = None) -> Comparison:
    """Compares two tensors of one shape in float64, over ``mask`` (bool, same shape).

    A NaN or infinity in either side counts as out of tolerance (``worst`` = inf).

    Raises:
        ValueError: shapes differ, or the mask selects nothing.
    """
    if actual.shape != reference.shape:
        raise ValueError(f'{name}: shapes differ, {tuple(actual.shape)} vs '
                         f'{tuple(reference.shape)}')
    a = actual.detach().double().cpu()
    r = reference.detach().double().cpu()
    if mask is not None:
        keep = mask.detach().bool().cpu()
        a, r = a[keep], r[keep]
    if a.numel() == 0:
        raise ValueError(f'{name}: nothing to compare (empty mask)')
    diff = (a - r).abs()
    bound = tol.atol + tol.rtol * r.abs()
    finite = bool(torch.isfinite(a).all() and torch.isfinite(r).all())
    worst = float((diff / bound).max()) if finite else float('inf')
    return Comparison(name, a.numel(), float(diff.max()), float(diff.mean()), worst,
                      tol.atol, tol.rtol)


def grad_agreement(a: Iterable[Tensor | None], b: Iterable[Tensor | None]) -> dict[str, float]:
    """Cosine similarity and relative L2 distance of two gradients (lists of per-parameter
    tensors, ``None`` for a parameter without one), accumulated in float64 per parameter
    (no flattened copy of the model).

    ``cosine = <a, b> / (|a| |b|)``; ``rel_l2 = |a - b| / |b|``.
    """
    dot = sq_a = sq_b = sq_diff = 0.0
    pairs = 0
    for x, y in zip(a, b, strict=True):
        if x is None and y is None:
            continue
        x = (x if x is not None else torch.zeros_like(y)).detach().double()
        y = (y if y is not None else torch.zeros_like(x)).detach().double()
        dot += float((x * y).sum())
        sq_a += float((x * x).sum())
        sq_b += float((y * y).sum())
        sq_diff += float(((x - y) ** 2).sum())
        pairs += 1
    if not pairs:
        raise ValueError('no gradients to compare')
    norm_a, norm_b = sq_a ** 0.5, sq_b ** 0.5
    return {'cosine': dot / max(norm_a * norm_b, 1e-300),
            'rel_l2': sq_diff ** 0.5 / max(norm_b, 1e-300), 'norm_a': norm_a, 'norm_b': norm_b}


def _inputs(batch: Any, device: torch.device) -> dict[str, Tensor]:
    return {k: getattr(batch, k).to(device) for k in ('input_ids', 'attention_mask',
                                                       'response_mask')}


def _pass(policy: Any, inputs: dict[str, Tensor], packed: bool, advantages: Tensor
          ) -> tuple[Tensor, Tensor, list[Tensor | None]]:
    """Logprobs, entropies and the gradient of ``-sum(A_i * logprob_it)`` of one path."""
    policy.zero_grad(set_to_none=True)
    logprobs, entropy = policy.response_logprobs(inputs, with_entropy=True, packed=packed)
    mask = inputs['response_mask']
    objective = -(torch.where(mask, logprobs.float(), 0) * advantages[:, None]).sum()
    objective.backward()
    grads = [None if p.grad is None else p.grad.detach().clone() for p in policy.parameters()]
    policy.zero_grad(set_to_none=True)
    return logprobs.detach(), entropy.detach(), grads


def packed_vs_padded(model_dir: str | Path, batch: Any, device: str | torch.device,
                     dtype: torch.dtype) -> dict[str, Any]:
    """The packed and the padded trainer passes of one micro-batch, and an fp32 reference.

    Runs ``RLPolicy.response_logprobs`` on ``batch`` (a ``ResponseBatch``) packed and padded
    in ``dtype`` on ``device``, with the gradient of ``-sum_i A_i sum_t logprob_it``
    (fixed random advantages), then the padded path in fp32 on the same weights (rounded to
    ``dtype``, so that only the arithmetic differs).

    Returns:
        ``{'attention', 'logprobs', 'entropies', 'packed_vs_fp32', 'padded_vs_fp32'}``
        (:class:`Comparison`) and ``'grads'`` (:func:`grad_agreement` of packed vs padded,
        with ``'cosine_min'`` the dtype's bound).
    """
    from ..model.policy import RLPolicy
    device = torch.device(device)
    name = str(dtype).removeprefix('torch.')
    loss = dict(type='CISPOLoss', eps_low=1.0, eps_high=4.0)
    policy = RLPolicy(str(model_dir), loss, torch_dtype=name, packing='on').to(device)
    reference = RLPolicy(str(model_dir), loss, torch_dtype='float32', packing='off').to(device)
    with torch.no_grad():  # the same (rounded) weights: only the arithmetic differs
        for p in reference.parameters():
            p.copy_(p.to(dtype).float())
    inputs = _inputs(batch, device)
    mask = inputs['response_mask']
    advantages = torch.randn(len(batch), generator=torch.Generator().manual_seed(0)).to(device)
    lp_packed, ent_packed, g_packed = _pass(policy, inputs, True, advantages)
    lp_padded, ent_padded, g_padded = _pass(policy, inputs, False, advantages)
    with torch.no_grad():
        lp_ref, _ = reference.response_logprobs(inputs, packed=False)
    tol = TOLERANCES[dtype]
    grads = grad_agreement(g_packed, g_padded)
    grads['cosine_min'] = GRAD_COSINE[dtype]
    from ..model.packing import _flash_varlen
    flash = (device.type == 'cuda' and dtype in (torch.float16, torch.bfloat16)
             and _flash_varlen() is not None)
    return {
        'attention': 'flash_attn varlen' if flash else 'SDPA per sequence',
        'logprobs': compare('packed vs padded logprobs', lp_packed, lp_padded,
                            tol['logprobs'], mask),
        'entropies': compare('packed vs padded entropies', ent_packed, ent_padded,
                             tol['entropies'], mask),
        'packed_vs_fp32': compare('packed vs fp32 logprobs', lp_packed, lp_ref,
                                  tol['vs_fp32'], mask),
        'padded_vs_fp32': compare('padded vs fp32 logprobs', lp_padded, lp_ref,
                                  tol['vs_fp32'], mask),
        'grads': grads}


def rollout_vs_trainer(policy: Any, prompts: list[list[int]], new_tokens: int,
                       backend: Any = None, batch_size: int = 64,
                       temperature: float = 1.0,
                       tol: Tolerance | None = None) -> dict[str, Any]:
    """Samples with a rollout backend, then scores the samples as the trainer.

    No stop token (every prompt gets ``new_tokens`` tokens), sampling at ``temperature``.
    The trainer's pass is the loop's own (:func:`~gepo_xtuner.engine.step.update.old_logprobs`
    over ``build_response_batch``), with logits divided by the temperature the backend
    declares for its logprobs (``backend.logprob_temperature(params)``: LMDeploy's are raw,
    1; the in-process backend's are at the sampling temperature). Where the two
    temperatures differ, the samples are also scored at the sampling temperature
    (``'logprobs_at_sampling_temperature'``): a backend that declared the wrong one would
    match that instead.

    ``backend``: an attached rollout backend (e.g. ``LMDeployRolloutBackend``); default
    an ``HFRolloutBackend`` of ``batch_size`` sequences per call on the policy itself.
    ``tol``: per-token tolerance (default ``TOLERANCES[dtype]['logprobs']``).

    Returns:
        ``{'logprobs': Comparison, 'logprob_temperature', 'generated_tokens', 'generate_s',
        'tokens_per_s'}`` (+ ``'logprobs_at_sampling_temperature'``, see above).
    """
    from ..engine.step.batching import build_response_batch
    from ..rollout import HFRolloutBackend, RolloutRequest, SamplingParams
    from ..engine.step.update import old_logprobs
    from .rl_step import step_settings
    if backend is None:
        backend = HFRolloutBackend(max_sequences_per_call=batch_size)
        backend.attach(policy.llm, policy.tokenizer)
    params = SamplingParams(n=1, temperature=temperature, max_new_tokens=new_tokens,
                            stop_token_ids=())
    declared = float(backend.logprob_temperature(params))
    device = next(policy.parameters()).device
    _sync(device)
    start = time.perf_counter()
    samples = backend.generate([RolloutRequest(input_ids=p) for p in prompts], params)
    _sync(device)
    seconds = time.perf_counter() - start
    batch = build_response_batch(prompts, samples, pad_token_id=policy.tokenizer.pad_token_id)
    tol = tol or TOLERANCES[next(policy.parameters()).dtype]['logprobs']

    def scored(t: float, name: str) -> Comparison:
        trainer, _ = old_logprobs(policy, batch, step_settings(
            max_tokens=1 << 16, minibatch=len(batch), temperature=t))
        return compare(name, batch.rollout_logprobs, trainer, tol, batch.response_mask)

    generated = int(batch.response_mask.sum())
    out = {'logprobs': scored(declared, f'rollout vs trainer logprobs (temperature '
                                        f'{declared:g})'),
           'logprob_temperature': declared, 'generated_tokens': generated,
           'generate_s': seconds, 'tokens_per_s': generated / seconds}
    if declared != temperature:
        out['logprobs_at_sampling_temperature'] = scored(
            temperature, f'rollout vs trainer logprobs (temperature {temperature:g})')
    return out


def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


# Dense bf16 tensor-core peak (TFLOP/s, no sparsity) by a part of the device name, most
# specific first (vendor datasheets). torch.cuda.get_device_name: 'NVIDIA H100 80GB HBM3'
# (SXM), 'NVIDIA H100 PCIe', 'NVIDIA H100 NVL', 'NVIDIA H200', 'NVIDIA A100-SXM4-80GB'.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ('H200', 989.0), ('H100 PCIe', 756.0), ('H100 NVL', 835.0), ('H100', 989.0),
    ('H20', 148.0), ('A100', 312.0), ('L40S', 362.0), ('A10G', 70.0), ('L4', 121.0))


def peak_bf16_tflops(device_name: str) -> float | None:
    """The bf16 dense peak of a GPU named as ``torch.cuda.get_device_name`` names it.

    >>> peak_bf16_tflops('NVIDIA H100 80GB HBM3'), peak_bf16_tflops('NVIDIA H200')
    (989.0, 989.0)
    >>> peak_bf16_tflops('NVIDIA H100 PCIe'), peak_bf16_tflops('some CPU') is None
    (756.0, True)
    """
    for part, tflops in PEAK_BF16_TFLOPS:
        if part.lower() in device_name.lower():
            return tflops
    return None


def step_flops(params: int, layers: int, attn_width: int, lengths: Iterable[int],
               forwards: float = 4.0) -> float:
    """Useful FLOPs of one RL step's trainer passes over sequences of ``lengths`` tokens.

    A forward over a sequence of ``l`` tokens costs ``2 N l`` for the weight matmuls
    (``N`` parameters, the tied head counted once: each is one multiply-add per token)
    plus ``2 * n_layers * d_attn * l (l + 1)`` for causal attention (``QK^T`` and ``PV``,
    token ``t`` attends to ``t`` positions: ``2 * 2 * d_attn * sum_t t`` per layer). A
    backward costs two forwards, so the step (a no-grad old-logprob forward, then forward
    + backward of the update) is ``forwards = 4`` forwards:
    ``FLOPs = 4 * sum_seq (2 N l + 2 n_layers d_attn l (l + 1))``, i.e. ``8 N`` per token
    plus attention. Padding is not counted (it is not useful work).

    >>> step_flops(10, 1, 4, [3])  # 4 * (2*10*3 + 2*1*4*3*4)
    624.0
    """
    total = 0.0
    for length in lengths:
        total += 2.0 * params * length + 2.0 * layers * attn_width * length * (length + 1)
    return forwards * total


def device_summary(device: str | torch.device | None = None) -> dict[str, Any]:
    """The device, its peak and the versions a figure depends on."""
    import transformers
    info: dict[str, Any] = {'torch': torch.__version__, 'transformers': transformers.__version__,
                            'cuda_available': torch.cuda.is_available()}
    if torch.cuda.is_available():
        index = torch.device(device or 'cuda').index or 0
        name = torch.cuda.get_device_name(index)
        info.update(device=name, cuda=torch.version.cuda,
                    capability='.'.join(map(str, torch.cuda.get_device_capability(index))),
                    memory_gib=round(torch.cuda.get_device_properties(index).total_memory
                                     / 2**30, 1),
                    peak_bf16_tflops=peak_bf16_tflops(name))
    else:
        info['device'] = 'cpu'
    return info


def record(check: str, figures: dict[str, Any], report_dir: Path | None = None) -> Path:
    """Appends ``{'check', 'time', **figures}`` as one JSON line to ``report.jsonl`` (and
    prints it). :class:`Comparison` values are written as their figures."""
    path = (report_dir or REPORT_DIR) / 'report.jsonl'
    path.parent.mkdir(parents=True, exist_ok=True)
    row = {'check': check, 'time': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
           **{k: v.figures() if isinstance(v, Comparison) else v for k, v in figures.items()}}
    line = json.dumps(row, default=str)
    with open(path, 'a', encoding='utf-8') as f:
        f.write(line + '\n')
    print(f'[gpu] {line}', flush=True)
    return path


def read_report(path: Path) -> list[dict[str, Any]]:
    """The rows :func:`record` wrote, in order (empty if there is no report)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding='utf-8').splitlines() if line]


def format_report(rows: list[dict[str, Any]]) -> str:
    """One block per check: its figures, one ``key: value`` line each, nested keys dotted."""
    def flat(prefix: str, value: Any) -> Iterable[tuple[str, Any]]:
        if isinstance(value, dict):
            for k, v in value.items():
                yield from flat(f'{prefix}.{k}' if prefix else k, v)
        else:
            yield prefix, value

    if not rows:
        return 'no GPU figures recorded (no CUDA device, or no GPU test ran)'
    out = []
    for row in rows:
        out.append(f"== {row.get('check')} ({row.get('time')})")
        for key, value in flat('', {k: v for k, v in row.items() if k not in ('check', 'time')}):
            text = f'{value:.4g}' if isinstance(value, float) else str(value)
            out.append(f'  {key}: {text}')
    return '\n'.join(out)
