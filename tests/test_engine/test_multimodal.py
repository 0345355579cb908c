"""Multimodal RL: records with images through the processor, rollout, minibatches and training.

Everything runs on a tiny randomly initialised Qwen2-VL (``gepo_xtuner.testbed.tiny_vl``)
with real PNG pictures: image placeholders expand inside the prompt, pixel patches
differ in number between pictures, and positions are Qwen2-VL's M-RoPE.
"""

import json
import math
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gepo_xtuner.engine.step.batching import ResponseBatch, build_response_batch, cut_at_tokens
from gepo_xtuner.engine.step.prompt_encoding import encode_request, prompt_token_ids
from gepo_xtuner.model.policy import RLPolicy
from gepo_xtuner.testbed.tiny_vl import (
                                         IMAGE_PAD,
                                         VISION_END,
                                         VISION_START,
                                         build_picture_tasks,
                                         draw_squares,
                                         save_tiny_vl,
                                         )
from gepo_xtuner.ops.multimodal import concat_mm_inputs, placeholder_token_ids
from gepo_xtuner.rollout import HFRolloutBackend, RolloutSample, SamplingParams

from .conftest import ROOT, scalars
from tests import preloaded

LOSS = {'type': 'CISPOLoss', 'eps_low': 1.0, 'eps_high': 4.0, 'agg': 'token-mean'}
VL_CLASS = 'Qwen2VLForConditionalGeneration'


@pytest.fixture(scope='module')
def vl_dir(tmp_path_factory) -> Path:
    """A tiny Qwen2-VL with processor (``model/``) and 16 picture records (``data/``)."""
    out = tmp_path_factory.mktemp('tiny_vl')
    save_tiny_vl(out / 'model', seed=0)
    build_picture_tasks(out / 'data', 16, seed=0)
    return out


@pytest.fixture(scope='module')
def policy(vl_dir) -> RLPolicy:
    return RLPolicy(str(vl_dir / 'model'), LOSS, model_class=VL_CLASS)


def records(vl_dir: Path, n: int) -> list[dict]:
    """The first n records, image paths resolved as the dataset resolves them."""
    from gepo_xtuner.data import load_records
    return load_records(vl_dir / 'data' / 'train.jsonl')[:n]


def logprobs(policy: RLPolicy, batch: ResponseBatch, mm: dict | None = None) -> torch.Tensor:
    inputs = {'input_ids': batch.input_ids, 'attention_mask': batch.attention_mask,
              'response_mask': batch.response_mask,
              'mm_inputs': batch.multimodal_inputs() if mm is None else mm}
    with torch.no_grad():
        return policy(inputs=inputs, mode='logprobs')[0]


# ------------------------------------------------------------------ batching (pure tensors)
def test_row_selections_carry_exactly_their_images_patches():
    # three prompts: 2 images (16 + 24 patches), none, 1 image (36 patches); every value
    # names its prompt and image, so a misplaced patch shows
    def image(prompt: int, i: int, grid: tuple[int, int, int]) -> tuple[torch.Tensor, ...]:
        n = grid[0] * grid[1] * grid[2]
        return torch.full((n, 6), 10.0 * prompt + i), torch.tensor([grid])

    per_prompt = []
    for p, grids in enumerate([[(1, 4, 4), (1, 4, 6)], [], [(1, 6, 6)]]):
        parts = [image(p, i, g) for i, g in enumerate(grids)]
        per_prompt.append({} if not parts else {
            'pixel_values': torch.cat([x for x, _ in parts]),
            'image_grid_thw': torch.cat([g for _, g in parts])})
    samples = [[RolloutSample([5] * (k + 1), [-0.5] * (k + 1), 'length') for k in range(2)]
               for _ in range(3)]  # K=2 responses per prompt
    batch = build_response_batch([[1, 2, 3], [4], [6, 7]], samples, 0, per_prompt)
    assert batch.group_index.tolist() == [0, 0, 1, 1, 2, 2]

    index = torch.tensor([5, 2, 0])  # prompt 2, prompt 1 (text only), prompt 0
    part = batch.rows(index)
    mm = part.multimodal_inputs()
    for key, value in batch.multimodal_inputs(index).items():  # same selection, both ways
        torch.testing.assert_close(mm[key], value, rtol=0, atol=0)
    expected = torch.cat([per_prompt[2]['pixel_values'], per_prompt[0]['pixel_values']])
    torch.testing.assert_close(mm['pixel_values'], expected, rtol=0, atol=0)
    assert mm['image_grid_thw'].tolist() == [[1, 6, 6], [1, 4, 4], [1, 4, 6]]
    # rows line up with the grids: patch counts per row follow the row order
    assert mm['pixel_values'].shape[0] == 36 + 16 + 24
    assert batch.rows(torch.tensor([2, 3])).multimodal_inputs() == {}  # text-only rows
    assert build_response_batch([[1]], [samples[0]], 0).multimodal_inputs() == {}


def test_batches_refuse_image_tensors_that_do_not_stack():
    with pytest.raises(ValueError, match='max_tokens_per_micro_batch=1 and '):
        concat_mm_inputs([{'pixel_values': torch.zeros(1, 3, 8, 8)},
                          {'pixel_values': torch.zeros(1, 3, 8, 16)}])


def test_responses_end_before_a_sampled_image_placeholder():
    samples = [[RolloutSample([4, 9, 5, 9], [-1.0, -2.0, -3.0, -4.0], 'stop'),
                RolloutSample([4, 5], [-1.0, -2.0], 'stop')]]
    cut = cut_at_tokens(samples, [9])
    assert cut[0][0] == RolloutSample([4], [-1.0], 'length')
    assert cut[0][1] is samples[0][1]


# ------------------------------------------------------------------ prompts with images
def test_requests_carry_both_prompt_forms(vl_dir, policy):
    tok, proc = policy.tokenizer, policy.processor
    pad, start, end = tok.convert_tokens_to_ids([IMAGE_PAD, VISION_START, VISION_END])
    rec = records(vl_dir, 2)[1]  # an 84x56 picture: 24 patches -> 6 image tokens
    req = encode_request(rec, tok, proc)
    assert req.images == rec['images'] and os.path.isabs(req.images[0])
    assert req.input_ids.count(pad) == 1  # what servers expand themselves
    assert req.model_input_ids.count(pad) == 6  # what the model scores
    assert req.mm_inputs['image_grid_thw'].tolist() == [[1, 4, 6]]
    assert req.mm_inputs['pixel_values'].shape[0] == 24
    assert prompt_token_ids(rec, tok, proc) == req.input_ids
    i = req.input_ids.index(pad)
    assert req.input_ids[i - 1:i + 2] == [start, pad, end]
    # "<image>" markers (verl's convention) place images like {"type": "image"} parts
    marked = dict(rec, messages=[{'role': 'user', 'content': '<image>how many squares?'}])
    assert encode_request(marked, tok, proc).model_input_ids == req.model_input_ids
    # no marker: the images open the first user turn
    bare = dict(rec, messages=[{'role': 'user', 'content': 'how many squares?'}])
    assert encode_request(bare, tok, proc).model_input_ids == req.model_input_ids
    # text-only records take the text path, unchanged
    text = {'id': 't', 'domain': 'd', 'messages': [{'role': 'user', 'content': 'hi'}]}
    plain = encode_request(text, tok, proc)
    assert plain.mm_inputs is None and plain.prompt_ids == plain.input_ids


def test_bad_image_prompts_say_what_to_fix(vl_dir, policy, tmp_path):
    tok, proc = policy.tokenizer, policy.processor
    rec = records(vl_dir, 1)[0]
    two = dict(rec, messages=[{'role': 'user', 'content': '<image><image>what colour?'}])
    with pytest.raises(ValueError, match=r"'train-0': the messages place 2 images but the "
                                         'record has 1'):
        encode_request(two, tok, proc)
    prompt = {'id': 'p', 'domain': 'd', 'prompt': 'what colour?', 'images': rec['images']}
    with pytest.raises(ValueError, match="image placeholder '<\\|image_pad\\|>' 0 times"):
        encode_request(prompt, tok, proc)
    ok = dict(prompt, prompt=f'{VISION_START}{IMAGE_PAD}{VISION_END}what colour?')
    assert encode_request(ok, tok, proc).model_input_ids.count(tok.convert_tokens_to_ids(
        IMAGE_PAD)) == 4
    with pytest.raises(ValueError, match='has images, but the policy has no processor'):
        encode_request(rec, tok, None)
    gone = dict(rec, images=[str(tmp_path / 'missing.png')])
    with pytest.raises(ValueError, match="'train-0': cannot load image"):
        encode_request(gone, tok, proc)


# ------------------------------------------------------------------ rollout == trainer
def test_rollout_and_trainer_score_the_same_image_conditioned_context(vl_dir, policy):
    tok, proc = policy.tokenizer, policy.processor
    recs = records(vl_dir, 5)
    recs.append({'id': 'text', 'domain': 'd',
                 'messages': [{'role': 'user', 'content': 'what colour is the sky?'}]})
    requests = [encode_request(r, tok, proc) for r in recs]
    backend = HFRolloutBackend(max_sequences_per_call=7)  # batches straddle prompts
    backend.attach(policy.llm, tok)
    assert set(backend.suppress) == set(placeholder_token_ids(policy.llm.config)) != set()
    torch.manual_seed(0)
    params = SamplingParams(n=3, max_new_tokens=5, stop_token_ids=(tok.eos_token_id, ))
    samples = backend.generate(requests, params)
    mm = [r.mm_inputs or {} for r in requests]
    batch = build_response_batch([r.prompt_ids for r in requests], samples, tok.pad_token_id, mm)
    mask = batch.response_mask
    full = logprobs(policy, batch)
    torch.testing.assert_close(full[mask], batch.rollout_logprobs[mask], rtol=0, atol=1e-5)
    # a row subset in another order scores its rows the same: it carries its own patches
    index = torch.tensor([17, 4, 9, 0, 12])
    part = batch.rows(index)
    torch.testing.assert_close(logprobs(policy, part)[part.response_mask],
                               full[index][:, :part.response_width][part.response_mask],
                               rtol=0, atol=1e-5)
    # the pictures matter: other pixels, other logprobs
    other = batch.multimodal_inputs()
    other['pixel_values'] = other['pixel_values'].flip(0)
    assert (logprobs(policy, batch, other) - full)[mask].abs().max() > 1e-3


def test_gradient_checkpointing_gives_the_same_gradients(vl_dir, policy):
    recs = records(vl_dir, 2)
    requests = [encode_request(r, policy.tokenizer, policy.processor) for r in recs]
    samples = [[RolloutSample([20, 21, 22], [-4.0] * 3, 'length')] for _ in requests]
    batch = build_response_batch([r.prompt_ids for r in requests], samples,
                                 policy.tokenizer.pad_token_id, [r.mm_inputs for r in requests])

    def grads(model: RLPolicy) -> dict[str, torch.Tensor]:
        model.zero_grad()
        inputs = {'input_ids': batch.input_ids, 'attention_mask': batch.attention_mask,
                  'response_mask': batch.response_mask, 'old_logprobs': batch.rollout_logprobs,
                  'advantages': torch.tensor([1.0, -0.5]),
                  'mm_inputs': batch.multimodal_inputs()}
        model(inputs=inputs, mode='loss')['loss'].backward()
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    checkpointed = RLPolicy(str(vl_dir / 'model'), LOSS, model_class=VL_CLASS,
                            gradient_checkpointing=True)
    checkpointed.train()
    policy.train()
    a, b = grads(policy), grads(checkpointed)
    assert any(k.startswith('llm.visual.') for k in a)  # the vision tower learns too
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6)
    policy.zero_grad()


def test_bfloat16_policy_takes_float32_pixels(vl_dir):
    policy = RLPolicy(str(vl_dir / 'model'), LOSS, model_class='AutoModelForImageTextToText',
                      torch_dtype='bfloat16')
    assert policy.llm.dtype == torch.bfloat16
    requests = [encode_request(r, policy.tokenizer, policy.processor) for r in records(vl_dir, 2)]
    assert requests[0].mm_inputs['pixel_values'].dtype == torch.float32
    backend = HFRolloutBackend()
    backend.attach(policy.llm, policy.tokenizer)
    samples = backend.generate(requests, SamplingParams(n=2, max_new_tokens=4))
    batch = build_response_batch([r.prompt_ids for r in requests], samples,
                                 policy.tokenizer.pad_token_id, [r.mm_inputs for r in requests])
    mask = batch.response_mask
    torch.testing.assert_close(logprobs(policy, batch)[mask], batch.rollout_logprobs[mask],
                               rtol=0, atol=1e-2)


def test_policy_build_errors_name_the_fix(vl_dir, tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        RLPolicy(str(tmp_path / 'models' / 'nope'), LOSS)
    assert 'does not exist: set the config variable / environment variable' in str(err.value)
    assert 'prepare_tiny_cpu' not in str(err.value)
    with pytest.raises(FileNotFoundError, match='prepare_tiny_cpu'):
        RLPolicy('work_dirs/tiny_cpu_missing/model', LOSS)
    with pytest.raises(ValueError, match="model_class 'AutoModelForNothing' is neither"):
        RLPolicy(str(vl_dir / 'model'), LOSS, model_class='AutoModelForNothing')
    policy = RLPolicy(str(vl_dir / 'model'), LOSS, model_class=VL_CLASS)
    policy.tokenizer.save_pretrained(tmp_path / 'tok_only')
    with pytest.raises(ValueError, match='holds no multimodal processor'):
        RLPolicy(str(vl_dir / 'model'), LOSS, model_class=VL_CLASS,
                 processor=str(tmp_path / 'tok_only'))


# ------------------------------------------------------------------ xtuner train, for real
def test_multimodal_rl_steps_through_xtuner_train(vl_dir, tmp_path):
    # one extra picture in another size (112x56: 32 patches) so batches mix three lengths
    draw_squares(vl_dir / 'data' / 'images' / 'wide.png', 'blue', 3, size=(112, 56))
    data = vl_dir / 'data' / 'mixed.jsonl'
    lines = (vl_dir / 'data' / 'train.jsonl').read_text().splitlines()
    wide = json.loads(lines[1]) | {'id': 'wide', 'answer': '3', 'images': ['images/wide.png']}
    data.write_text('\n'.join(lines + [json.dumps(wide)]) + '\n')
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(textwrap.dedent(f"""
        _base_ = ['{ROOT / 'configs' / 'gepo_tiny_cpu.py'}']
        custom_imports = dict(imports=['gepo_xtuner', 'tests.test_engine.plugins'],
                              allow_failed_imports=False)
        model = dict(_delete_=True, type='RLPolicy', pretrained='{vl_dir / 'model'}',
                     model_class='{VL_CLASS}', policy_loss={LOSS!r})
        train_dataloader = dict(batch_size=4, dataset=dict(path='{data}'))
        train_cfg = dict(
            max_steps=3, num_responses=4, minibatch_responses_per_rank=8,
            max_tokens_per_micro_batch=200,
            logprob_max_tokens_per_micro_batch=1, val=None, sampling=dict(max_new_tokens=6),
            rewards=dict(default=dict(_delete_=True, type='ShortAnswerReward', max_len=5)))
        default_hooks = dict(checkpoint=dict(interval=3))
    """))
    work = tmp_path / 'run'
    proc = preloaded.run(
        [sys.executable, '-m', 'xtuner.tools.train', str(cfg), '--work-dir', str(work)],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=False,
        env=dict(os.environ, PYTHONPATH=str(ROOT), GEPO_TINY_DIR=str(tmp_path / 'unused')))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    logged = scalars(work)
    assert set(range(1, 4)) <= set(logged)
    for step in (1, 2, 3):
        row = logged[step]
        # the trainer scored each response on the context it was sampled from
        assert row['rollout/logprob_abs_diff'] < 1e-5, (step, row['rollout/logprob_abs_diff'])
        for key in ('reward/mean/colour', 'reward/mean/count', 'entropy/policy/colour',
                    'entropy/group_nll/count', 'loss/pg'):
            assert key in row and math.isfinite(row[key]), (step, key)
    assert any(0 < logged[s]['reward/mean'] < 1 for s in (1, 2, 3))  # there was signal
    assert all(logged[s]['optim/micro_batches'] > 1 for s in (1, 2, 3))  # accumulated

    before = load_file(vl_dir / 'model' / 'model.safetensors')
    after = torch.load(work / 'iter_3.pth', map_location='cpu', weights_only=False)['state_dict']
    changed = {k for k, v in before.items() if not torch.equal(v, after['llm.' + k])}
    # AdamW without weight decay moves only parameters that received gradient
    assert any(k.startswith('visual.') for k in changed), 'the vision tower got no gradient'
    assert any(k.startswith('model.layers.') for k in changed)
