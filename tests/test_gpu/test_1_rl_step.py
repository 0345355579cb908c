"""One RL step in bf16 on CUDA through XTuner's entry point (``python -m xtuner.tools.train``).

The tiny testbed config (GEPO, CISPO loss, KL to the initial weights, HF rollouts) with the
policy in bf16, on a tiny Qwen2 and on one with Qwen2.5-0.5B's shapes (494M parameters,
random weights). Fails on a wrong result, not only on a crash: the trainer's old-policy
logprobs must match the rollout's (``rollout/logprob_abs_diff``, both bf16 on CUDA, the
trainer packed, generation padded with a KV cache) within the bf16 logprob tolerance, and
losses, gradient norms and the saved weights must be finite, with the weights moved.
"""

import math

import pytest
import torch

from gepo_xtuner.testbed.gpu import TOLERANCES, record
from tests.test_engine.conftest import scalars, train, write_config

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize('size', ['tiny', 'qwen2-0.5b-layers'])
def test_one_rl_step_in_bf16_on_cuda_through_xtuner(size, tmp_path, tiny_dir, model_dirs,
                                                    device) -> None:
    from safetensors.torch import load_file
    model = model_dirs[size]
    work = tmp_path / 'work'
    train(write_config(tmp_path), work, tiny_dir, f'model.pretrained={model}',
          'model.torch_dtype=bfloat16', 'train_cfg.max_steps=2',
          'default_hooks.checkpoint.interval=2', 'train_cfg.val.interval=100',
          timeout=540)
    logged = scalars(work)
    assert {1, 2} <= set(logged), logged  # step 0: the first validation only
    tol = TOLERANCES[torch.bfloat16]['logprobs'].atol
    for step, row in ((s, logged[s]) for s in (1, 2)):
        for key in ('loss/pg', 'loss/kl_ref', 'optim/grad_norm', 'rollout/logprob_abs_diff'):
            assert math.isfinite(row[key]), (step, key, row)
        # a step whose every advantage is 0 and whose policy still equals the reference
        # has no gradient to give (the weights must still move over the two steps, below)
        if row['adv/frac_zero'] < 1 or row['loss/kl_ref'] > 0:
            assert row['optim/grad_norm'] > 0, (step, row)
        # mean over tokens; per-token agreement is checked in test_3_hf_rollout
        assert row['rollout/logprob_abs_diff'] <= tol, row
    ckpt = torch.load(work / 'iter_2.pth', map_location='cpu', weights_only=False)
    after = {k.removeprefix('llm.'): v for k, v in ckpt['state_dict'].items()
             if k.startswith('llm.')}
    before = load_file(model / 'model.safetensors')
    moved = 0
    for name, weight in before.items():
        got = after[name]
        assert got.dtype == torch.bfloat16 and torch.isfinite(got.float()).all(), name
        moved += int(not torch.equal(got.float(), weight.to(got.dtype).float()))
    assert moved > 0, 'no weight changed in two RL steps'
    record(f'rl_step[{size}]', {
        'steps': {s: {k: logged[s][k] for k in (
            'loss/pg', 'loss/kl_ref', 'optim/grad_norm', 'rollout/logprob_abs_diff',
            'adv/frac_zero', 'reward/mean', 'perf/gen_tokens_per_sec', 'memory', 'time')
            if k in logged[s]} for s in (1, 2)},
        'logprob_abs_diff_max_allowed': tol, 'tensors_moved': moved,
        'tensors': len(before)})


def test_generation_ahead_of_the_update_on_cuda(tmp_path, tiny_dir, model_dirs, device) -> None:
    """``train_cfg.max_staleness=1`` on CUDA: the in-process backend samples step ``t+1``'s
    batch on the generation worker thread (on the trainer's CUDA device, from its own copy
    of the policy) while step ``t`` updates. Three steps: every training step logs a finite
    loss and gradient, steps 2 and 3 sampled one weight version behind
    (``rollout/staleness`` 1), and the trainer's old logprobs stay within the bf16 tolerance
    of the rollout's (one update at lr 1e-6 moves them far less)."""
    work = tmp_path / 'work'
    train(write_config(tmp_path), work, tiny_dir, f'model.pretrained={model_dirs["tiny"]}',
          'model.torch_dtype=bfloat16', 'train_cfg.max_steps=3', 'train_cfg.max_staleness=1',
          'default_hooks.checkpoint.interval=3', 'train_cfg.val.interval=100', timeout=540)
    logged = scalars(work)
    assert {1, 2, 3} <= set(logged), logged
    tol = TOLERANCES[torch.bfloat16]['logprobs'].atol
    for step in (1, 2, 3):
        row = logged[step]
        assert math.isfinite(row['loss/pg']) and row['optim/grad_norm'] > 0, (step, row)
        assert row['rollout/logprob_abs_diff'] <= tol, (step, row)
    assert [logged[s].get('rollout/staleness') for s in (2, 3)] == [1.0, 1.0], logged
    record('rl_step[tiny, max_staleness=1]', {'steps': {s: {k: logged[s][k] for k in (
        'loss/pg', 'optim/grad_norm', 'rollout/logprob_abs_diff', 'rollout/staleness',
        'perf/gen_tokens_per_sec', 'time') if k in logged[s]} for s in (1, 2, 3)}})
