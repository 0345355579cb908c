"""Packed (padding-free) trainer passes equal the padded ones, on real tiny models."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from gepo_xtuner.model.packing import pack_rows
from gepo_xtuner.model.policy import RLPolicy
from gepo_xtuner.testbed.tiny import build_char_tokenizer, build_tiny_model

LOSS = dict(type='CISPOLoss', eps_low=1.0, eps_high=4.0)


def save_qwen2(path):
    tok = build_char_tokenizer()
    build_tiny_model(len(tok), seed=3).save_pretrained(path)
    tok.save_pretrained(path)


def save_llama(path):  # grouped-query attention (4 heads, 2 KV heads), untied head
    tok = build_char_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2)
    with torch.random.fork_rng(devices=[]):  # leaves the global RNG to the other tests
        torch.manual_seed(5)
        LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)


@pytest.fixture(scope='module', params=['qwen2', 'llama'])
def model_dir(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    {'qwen2': save_qwen2, 'llama': save_llama}[request.param](path)
    return str(path)


def padded_batch(prompt_lengths, response_lengths, seed=0, vocab=40):
    """``[left-padded prompt | right-padded response]`` rows with the given real lengths."""
    gen = torch.Generator().manual_seed(seed)
    n, p, r = len(prompt_lengths), max(prompt_lengths), max(max(response_lengths), 1)
    ids = torch.randint(4, vocab, (n, p + r), generator=gen)
    attention = torch.zeros_like(ids)
    response = torch.zeros(n, r, dtype=torch.bool)
    for i, (pl, rl) in enumerate(zip(prompt_lengths, response_lengths)):
        attention[i, p - pl:p + rl] = 1
        response[i, :rl] = True
        ids[i, :p - pl] = 0
        ids[i, p + rl:] = 0
    return dict(input_ids=ids, attention_mask=attention, response_mask=response,
                advantages=torch.randn(n, generator=gen), temperature=0.7)


def grads(policy):
    return [p.grad.clone() for p in policy.parameters() if p.grad is not None]


@pytest.mark.parametrize('checkpointing', [False, True])
def test_packed_logprobs_entropies_loss_and_gradients_equal_padded(model_dir, checkpointing):
    packed = RLPolicy(model_dir, LOSS, gradient_checkpointing=checkpointing)
    padded = RLPolicy(model_dir, LOSS, packing='off', gradient_checkpointing=checkpointing)
    assert packed.packs and packed.packing_problem is None and not padded.packs
    inputs = padded_batch([6, 3, 1, 4, 5], [7, 2, 0, 5, 1])
    mask = inputs['response_mask']
    lp, ent = packed(inputs=inputs, mode='logprobs')
    ref_lp, ref_ent = padded(inputs=inputs, mode='logprobs')
    assert lp.shape == ref_lp.shape == mask.shape
    torch.testing.assert_close(lp[mask], ref_lp[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent[mask], ref_ent[mask], rtol=1e-5, atol=1e-5)
    assert (lp[~mask] == 0).all() and (ent[~mask] == 0).all()
    inputs['old_logprobs'] = ref_lp + 0.05 * torch.randn(ref_lp.shape)
    for policy in (packed, padded):
        policy.train()
        policy.llm.zero_grad()
        out = policy(inputs=inputs, mode='loss')
        out['loss'].backward()
        policy.out = out
    torch.testing.assert_close(packed.out['loss'], padded.out['loss'], rtol=1e-5, atol=1e-6)
    for a, b in zip(grads(packed), grads(padded), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_masked_response_tokens_that_are_attended_keep_their_place(model_dir):
    """Response tokens left out of the loss (mask False) still count in the sequence."""
    packed, padded = RLPolicy(model_dir, LOSS), RLPolicy(model_dir, LOSS, packing='off')
    inputs = padded_batch([4, 2, 5], [5, 3, 4], seed=3)
    inputs['response_mask'][0, 2:] = False  # attended, not scored
    inputs['response_mask'][2, :] = False
    mask = inputs['response_mask']
    lp, ent = packed(inputs=inputs, mode='logprobs')
    ref_lp, ref_ent = padded(inputs=inputs, mode='logprobs')
    torch.testing.assert_close(lp[mask], ref_lp[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent[mask], ref_ent[mask], rtol=1e-5, atol=1e-5)


def test_kl_reference_runs_packed_and_matches(model_dir):
    packed = RLPolicy(model_dir, LOSS, kl_coef=0.3)
    padded = RLPolicy(model_dir, LOSS, kl_coef=0.3, packing='off')
    with torch.no_grad():
        for a, b in zip(packed.llm.parameters(), padded.llm.parameters()):
            noise = torch.randn_like(a) * 0.05
            a.add_(noise)
            b.add_(noise)
    inputs = padded_batch([2, 5, 3], [4, 1, 6], seed=1)
    inputs['old_logprobs'] = padded(inputs=inputs, mode='logprobs')[0]
    out, ref = packed(inputs=inputs, mode='loss'), padded(inputs=inputs, mode='loss')
    assert out['loss/kl_ref'] > 0
    torch.testing.assert_close(out['loss/kl_ref'], ref['loss/kl_ref'], rtol=1e-5, atol=1e-6)


def test_rows_without_response_tokens_give_a_zero_loss_with_zero_gradients(model_dir):
    policy = RLPolicy(model_dir, LOSS)
    inputs = padded_batch([3, 4], [2, 3])
    inputs['old_logprobs'] = torch.zeros(inputs['response_mask'].shape)
    inputs['response_mask'] = torch.zeros_like(inputs['response_mask'])  # the loop's empty batch
    out = policy(inputs=inputs, mode='loss')
    out['loss'].backward()
    assert out['loss'] == 0
    assert all((g == 0).all() for g in grads(policy))


def test_packing_modes_are_validated(model_dir):
    with pytest.raises(ValueError, match='packing must be one of'):
        RLPolicy(model_dir, LOSS, packing='yes')
    assert RLPolicy(model_dir, LOSS, packing='on').packs


def test_pack_rows_matches_a_reference_loop():
    inputs = padded_batch([3, 1, 4], [2, 0, 3], seed=2)
    ids, att, mask = inputs['input_ids'], inputs['attention_mask'], inputs['response_mask']
    pos = (att.cumsum(-1) - 1).clamp_min(0)
    rows = pack_rows(ids, att, pos, mask)
    flat, positions, starts, labels = [], [], [0], []
    for i in range(len(ids)):
        real = ids[i][att[i].bool()].tolist()
        r = int(mask[i].sum())
        p = len(real) - r
        flat += real
        positions += list(range(len(real)))
        starts.append(starts[-1] + len(real))
        # position p - 1 + t predicts response token t (the token at p + t)
        labels += [-100] * (p - 1) + real[p:] + [-100]
    assert rows.input_ids[0].tolist() == flat
    assert rows.position_ids[0].tolist() == positions
    assert rows.cu_seqlens.tolist() == starts and rows.max_length == 7
    assert rows.labels[0].tolist() == labels
    width = mask.shape[1]
    for i in range(len(ids)):
        for t in range(int(mask[i].sum())):
            assert flat[int(rows.index[i, t]) + 1] == int(ids[i, -width + t])


def test_a_response_without_prompt_cannot_be_packed():
    inputs = padded_batch([1, 2], [2, 1])
    inputs['attention_mask'][0, 1] = 0  # row 0 keeps no prompt token
    att = inputs['attention_mask']
    assert pack_rows(inputs['input_ids'], att, (att.cumsum(-1) - 1).clamp_min(0),
                     inputs['response_mask']) is None


def test_qwen2_vl_falls_back_to_the_padded_path_or_packs_exactly(tmp_path):
    from gepo_xtuner.testbed.tiny_vl import save_tiny_vl
    try:
        save_tiny_vl(tmp_path)
    except TypeError as exc:  # newer transformers' Qwen2VLProcessor wants a video processor
        pytest.skip(f'the tiny Qwen2-VL cannot be built on this transformers: {exc}')
    kwargs = dict(model_class='Qwen2VLForConditionalGeneration')
    policy = RLPolicy(str(tmp_path), LOSS, **kwargs)
    padded = RLPolicy(str(tmp_path), LOSS, packing='off', **kwargs)
    if not policy.packs:  # transformers 4.48: Qwen2-VL's attention classes predate the table
        assert 'attention-function table' in policy.packing_problem
        with pytest.raises(ValueError, match="packing='on'"):
            RLPolicy(str(tmp_path), LOSS, packing='on', **kwargs)
    inputs = padded_batch([4, 2, 6], [3, 5, 1], vocab=40)
    mask = inputs['response_mask']
    lp, ent = policy(inputs=inputs, mode='logprobs')
    ref_lp, ref_ent = padded(inputs=inputs, mode='logprobs')
    torch.testing.assert_close(lp[mask], ref_lp[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent[mask], ref_ent[mask], rtol=1e-5, atol=1e-5)


def test_transformers_5_packs_qwen2_exactly_and_keeps_qwen3_5_padded(tmp_path, tf5_deps):
    """Qwen3.5's gated-delta-net layers carry state along the row: packing is declined."""
    code = textwrap.dedent(f"""
        import torch
        from pathlib import Path
        from tests.transformers5_plugins import write_tiny_dir
        from tests.test_model.test_packing import padded_batch
        from gepo_xtuner.model.policy import RLPolicy
        loss = dict(type='CISPOLoss')
        for kind in ('qwen2', 'qwen3_5'):
            d = Path({str(tmp_path)!r}) / kind
            write_tiny_dir(kind, d)
            auto = RLPolicy(str(d / 'model'), loss)
            off = RLPolicy(str(d / 'model'), loss, packing='off')
            inputs = padded_batch([5, 2, 3], [4, 6, 1])
            mask = inputs['response_mask']
            a, ea = auto(inputs=inputs, mode='logprobs')
            b, eb = off(inputs=inputs, mode='logprobs')
            torch.testing.assert_close(a[mask], b[mask], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(ea[mask], eb[mask], rtol=1e-5, atol=1e-5)
            print(kind, auto.packs, auto.packing_problem)
    """)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=f'{tf5_deps}{os.pathsep}{root}', OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env,
                          cwd=root, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert 'qwen2 True None' in proc.stdout
    assert "qwen3_5 False the model has ['linear_attention'] layers" in proc.stdout
