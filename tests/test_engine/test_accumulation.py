"""Gradient accumulation is exact: M micro-batches, P ranks == one big batch.

The RL loop normalises every micro-batch's loss by the whole minibatch's counts over
all ranks and multiplies by the world size before backward (DDP averages
gradients). These tests run the loop's own pieces (``micro_batches``,
``loss_inputs``, ``optimizer_step``, ``all_reduce``) on a real tiny Qwen2 policy
with a real mmengine ``OptimWrapper`` (SGD, gradient clipping) and compare the
parameters after one optimizer step. SGD rather than Adam: Adam's first step is
``lr * sign(g)``, which turns float rounding of near-zero gradient entries into
full-size differences and would hide real errors behind a loose tolerance.
"""

import os
import random
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from mmengine.model import MMDistributedDataParallel
from mmengine.optim import OptimWrapper

from gepo_xtuner.engine.step.batching import build_response_batch, loss_inputs, micro_batches
from gepo_xtuner.engine.step.optim_step import check_accumulation, optimizer_step
from gepo_xtuner.model.policy import RLPolicy
from gepo_xtuner.ops.distributed import all_reduce
from gepo_xtuner.rollout import RolloutSample, SamplingParams

LOSSES = {
    'cispo-token-mean': dict(type='CISPOLoss', agg='token-mean'),
    'ppo-seq-mean': dict(type='PPOClipLoss', clip_low=0.2, clip_high=0.2,
                         agg='seq-mean-token-mean'),
    'ppo-dr-grpo': dict(type='PPOClipLoss', agg='seq-mean-token-sum-norm'),
}
SAMPLING = SamplingParams(temperature=0.7, max_new_tokens=12)


def make_batch(seed: int, n_prompts: int = 4, k: int = 3):
    """Prompts of 2..9 tokens, responses of 1..12 (some rows much longer than others)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(4, 50) for _ in range(rng.randint(2, 9))] for _ in range(n_prompts)]
    samples = [[RolloutSample([rng.randrange(4, 50) for _ in range(rng.randint(1, 12))], [], 'stop')
                for _ in range(k)] for _ in range(n_prompts)]
    for group in samples:
        for s in group:
            s.logprobs.extend(-rng.uniform(0.5, 4.0) for _ in s.response_ids)
    batch = build_response_batch(prompts, samples, pad_token_id=0)
    gen = torch.Generator().manual_seed(seed)
    old = batch.rollout_logprobs + 0.05 * torch.randn(batch.rollout_logprobs.shape, generator=gen)
    adv = torch.randn(len(batch), generator=gen)
    return batch, old, adv


def build(model_dir, loss: dict, kl_coef: float = 0.0):
    torch.manual_seed(0)
    policy = RLPolicy(pretrained=str(model_dir), policy_loss=loss, kl_coef=kl_coef)
    opt = torch.optim.SGD(policy.parameters(), lr=1.0)
    return policy, OptimWrapper(opt, clip_grad=dict(max_norm=1.0))


def split(rows: torch.Tensor, m: int, seed: int) -> list[torch.Tensor]:
    """``m`` non-empty random micro-batches of unequal sizes."""
    perm = rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed))]
    cuts = sorted(random.Random(seed).sample(range(1, len(rows)), m - 1))
    return [p for p in torch.tensor_split(perm, cuts) if len(p)]


def step(model, wrapper, batch, old, adv, parts, world: int = 1):
    rows = torch.cat(parts) if parts else torch.arange(0)
    mask = batch.response_mask[rows]
    totals = all_reduce(torch.tensor([float(mask.sum()), float(mask.any(1).sum())],
                                     dtype=torch.float64))
    inputs = [loss_inputs(batch, p, old, adv, totals, temperature=SAMPLING.temperature,
                          norm_length=SAMPLING.max_new_tokens) for p in parts]
    logs, grad_norm = optimizer_step(model, wrapper, inputs, loss_scale=float(world))
    return logs, grad_norm


def params(model) -> dict[str, torch.Tensor]:
    module = model.module if hasattr(model, 'module') else model
    return {k: v.detach().clone() for k, v in module.llm.named_parameters()}


@pytest.mark.parametrize('loss', list(LOSSES))
@pytest.mark.parametrize('m', [3, 8])
def test_m_micro_batches_equal_one_batch(tiny_dir, loss, m):
    batch, old, adv = make_batch(seed=m)
    results = []
    for parts in ([torch.arange(len(batch))], split(torch.arange(len(batch)), m, seed=m)):
        assert len(parts) == (1 if len(results) == 0 else m)
        model, wrapper = build(tiny_dir / 'model', LOSSES[loss])
        logs, grad_norm = step(model, wrapper, batch, old, adv, parts)
        loss_sum = sum(float(x['loss']) for x in logs)
        results.append((params(model), grad_norm, loss_sum))
    (one, g1, l1), (many, gm, lm) = results
    assert g1 > 0 and gm == pytest.approx(g1, rel=1e-5)
    assert lm == pytest.approx(l1, rel=1e-5, abs=1e-7)  # micro-batch losses add up
    moved = sum(float((one[k] - many[k]).abs().max()) for k in one)
    torch.testing.assert_close(many, one, rtol=1e-5, atol=1e-6)
    assert moved < 1e-4
    first, _ = build(tiny_dir / 'model', LOSSES[loss])
    assert any(not torch.equal(first.llm.state_dict()[k], v) for k, v in one.items())  # it moved


def test_token_budget_micro_batches_with_kl_penalty_equal_one_batch(tiny_dir):
    batch, old, adv = make_batch(seed=11, n_prompts=6, k=4)
    prompt_len, response_len = batch.lengths()
    rows = torch.arange(len(batch))
    budgeted = micro_batches(rows, prompt_len, response_len, max_tokens=60)
    assert len(budgeted) >= 3
    out = []
    for parts in ([rows], budgeted):
        model, wrapper = build(tiny_dir / 'model', LOSSES['cispo-token-mean'], kl_coef=0.5)
        step(model, wrapper, batch, old, adv, parts)
        out.append(params(model))
    torch.testing.assert_close(out[1], out[0], rtol=1e-5, atol=1e-6)


def test_budget_partition_covers_rows_once_and_respects_the_budget():
    gen = torch.Generator().manual_seed(0)
    for trial in range(50):
        n = int(torch.randint(1, 40, (1, ), generator=gen))
        prompt = torch.randint(1, 30, (n, ), generator=gen)
        response = torch.randint(0, 60, (n, ), generator=gen)
        rows = torch.randperm(n, generator=gen)[:max(1, n - 3)]
        budget = int(torch.randint(20, 400, (1, ), generator=gen))
        parts = micro_batches(rows, prompt, response, budget)
        assert sorted(torch.cat(parts).tolist()) == sorted(rows.tolist())
        for part in parts:
            size = len(part) * (int(prompt[part].max()) + max(1, int(response[part].max())))
            assert size <= budget or len(part) == 1, (trial, size, budget)
    assert micro_batches(torch.arange(0), prompt, response, 10) == []
    assert [p.tolist() for p in micro_batches(torch.arange(3), prompt, response, None)] == [[0, 1, 2]]


def test_wrapper_accumulation_is_refused_with_what_to_change():
    with pytest.raises(ValueError, match='remove accumulative_counts'):
        check_accumulation(dict(type='OptimWrapper', accumulative_counts=4))
    check_accumulation(dict(type='OptimWrapper'))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, model_dir: str, shards, out: str) -> None:
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group('gloo', rank=rank, world_size=world)
    try:
        batch, old, adv = make_batch(seed=5, n_prompts=6, k=4)
        model, wrapper = build(model_dir, LOSSES['cispo-token-mean'])
        ddp = MMDistributedDataParallel(module=model, device_ids=None)
        logs, grad_norm = step(ddp, wrapper, batch, old, adv, shards[rank], world=world)
        if rank == 0:
            torch.save(dict(params=params(ddp), grad_norm=grad_norm,
                            loss=sum(float(x['loss']) for x in logs)), out)
    finally:
        dist.destroy_process_group()


def test_two_ranks_equal_one_rank_on_the_union(tiny_dir, tmp_path):
    batch, old, adv = make_batch(seed=5, n_prompts=6, k=4)
    tokens = batch.response_mask.sum(1)
    order = torch.argsort(tokens, descending=True)
    # rank 0: the 6 longest responses in 3 micro-batches; rank 1: the other 18 in 2
    shards = [split(order[:6], 3, seed=1), split(order[6:], 2, seed=2)]
    assert tokens[order[:6]].sum() != tokens[order[6:]].sum()  # unequal token counts
    out = tmp_path / 'rank0.pt'
    mp.spawn(_rank_main, args=(2, _free_port(), str(tiny_dir / 'model'), shards, str(out)),
             nprocs=2, join=True)
    two = torch.load(out, weights_only=False)
    model, wrapper = build(tiny_dir / 'model', LOSSES['cispo-token-mean'])
    _, grad_norm = step(model, wrapper, batch, old, adv, [torch.arange(len(batch))])
    torch.testing.assert_close(two['params'], params(model), rtol=1e-5, atol=1e-6)
    assert two['grad_norm'] == pytest.approx(grad_norm, rel=1e-5)
