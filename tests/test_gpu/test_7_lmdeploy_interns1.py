"""The Intern-S1-shaped VLM through LMDeploy 0.18's own server and PyTorch engine on CUDA.

The CPU suite runs LMDeploy's server, its ``/generate`` handler and its vision
preprocessing as shipped, with a stand-in for the engine
(``tests/test_rollout/test_lmdeploy_vl_server.py``). Here the engine is LMDeploy's own
(``InternVLForConditionalGeneration`` of ``lmdeploy/pytorch/models/internvl3_hf.py``, which
also serves ``InternS1ForConditionalGeneration``), on the tiny Intern-S1-shaped VLM of
:mod:`gepo_xtuner.testbed.tiny_interns1` with head sizes every kernel takes (64), in bf16:

* image prompts (1, 3 and 5 tiles, two images per prompt): the
  server's logprobs match the trainer's scoring of the same tokens on the trainer's own
  image context within the bf16 tolerance, and the bare-placeholder payload (what was sent
  before) is off by more (the context then lacks ``<img>`` / ``</img>``);
* a CUDA-IPC push of the vision tower and projector alone (the language model unchanged):
  the server's logprobs on image prompts follow the new vision weights and are off the old
  ones' by 10 times more;
* two RL steps with images through ``xtuner train``: ``rollout/logprob_abs_diff`` within
  the bf16 tolerance on both (the second samples from the pushed weights).

Needs lmdeploy and transformers >= 4.52 (the GPU machines' 5.x); skipped with the reason
without them.
"""

import copy
import dataclasses
import importlib.util
import json
import math

import pytest
import torch

from gepo_xtuner.engine.step.batching import cut_at_tokens
from gepo_xtuner.engine.step.prompt_encoding import encode_request
from gepo_xtuner.ops.multimodal import placeholder_token_ids
from gepo_xtuner.rollout import LMDeployRolloutBackend, SamplingParams
from gepo_xtuner.testbed.gpu import TOLERANCES, compare, record
from tests.test_engine.conftest import scalars, train, write_config

transformers = pytest.importorskip('transformers')
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    importlib.util.find_spec('lmdeploy') is None,
    reason='needs lmdeploy: install tools/prepare_gpu_bundle.py\'s wheels (tools/gpu_run.sh)'),
    pytest.mark.skipif(not hasattr(transformers, 'InternVLForConditionalGeneration'),
                       reason='needs transformers >= 4.52 (the internvl classes)')]

STARTUP_S = 420
SERVER_ARGS = ['--cache-max-entry-count', '0.2', '--session-len', '2048']
# initializer_range 0.15 (not 0.02), as tests/test_gpu/conftest.py's models: logits spread
# over a few nats, so a wrong context or stale weights move logprobs far beyond bf16 rounding
SIZES = dict(text=dict(hidden_size=256, intermediate_size=512, head_dim=64,
                       initializer_range=0.15),
             vision=dict(hidden_size=128, intermediate_size=256, initializer_range=0.15),
             initializer_range=0.15)
PERTURB = 0.02


@pytest.fixture(scope='module')
def vlm(tmp_path_factory):
    from gepo_xtuner.testbed.tiny_interns1 import build_interns1_picture_tasks, save_tiny_interns1
    root = tmp_path_factory.mktemp('interns1_gpu')
    save_tiny_interns1(root / 'model', seed=0, dtype=torch.bfloat16, **SIZES)
    build_interns1_picture_tasks(root / 'data', 12, seed=0)
    return root


def _requests(root, processor, n: int = 8):
    out = []
    for line in (root / 'data' / 'train.jsonl').read_text().splitlines()[:n]:
        record_ = json.loads(line)
        record_['images'] = [str(root / 'data' / p) for p in record_['images']]
        out.append(encode_request(record_, processor.tokenizer, processor))
    return out


def _scored(llm, requests, samples) -> tuple[torch.Tensor, torch.Tensor]:
    """(server logprobs, trainer logprobs) over every sampled token, the trainer scoring each
    response on its own prompt's ids and pixels; responses are cut before a sampled image
    placeholder, as the RL loop cuts them."""
    theirs, mine = [], []
    samples = cut_at_tokens(samples, placeholder_token_ids(llm.config))
    for request, group in zip(requests, samples):
        for sample in group:
            if not sample.response_ids:
                continue
            ids = torch.tensor([request.prompt_ids + sample.response_ids], device=llm.device)
            mm = {k: v.to(llm.device) for k, v in (request.mm_inputs or {}).items()}
            with torch.no_grad():
                logits = llm(input_ids=ids, **mm).logits[0].float()
            start = len(request.prompt_ids) - 1
            logp = torch.log_softmax(logits[start:start + len(sample.response_ids)], -1)
            mine.append(logp.gather(1, torch.tensor(sample.response_ids, device=llm.device)[:, None])[:, 0].cpu())
            theirs.append(torch.tensor(sample.logprobs))
    return torch.cat(theirs), torch.cat(mine)


def test_lmdeploy_engine_scores_image_prompts_as_the_trainer_and_takes_the_vision_push(
        vlm, device, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor
    processor = AutoProcessor.from_pretrained(vlm / 'model')
    llm = AutoModelForImageTextToText.from_pretrained(vlm / 'model',
                                                      torch_dtype=torch.bfloat16).to(device)
    backend = LMDeployRolloutBackend(
        launch={'model_path': str(vlm / 'model'), 'port': 0, 'extra_args': SERVER_ARGS,
                'log_file': str(tmp_path / 'server.log'), 'startup_timeout_s': STARTUP_S},
        weight_sync={'mode': 'ipc'}, sleep_wake=True, timeout_s=300)
    tol = TOLERANCES[torch.bfloat16]['logprobs']
    params = SamplingParams(n=4, max_new_tokens=24, temperature=1.0)
    requests = _requests(vlm, processor)
    try:
        backend.attach(llm, processor.tokenizer)
        samples = backend.generate(requests, params)
        now = compare('interns1 image prompts', *_scored(llm, requests, samples), tol)
        bare = [dataclasses.replace(r, model_input_ids=None) for r in requests]  # old form
        old_form = compare('bare placeholder payload',
                           *_scored(llm, requests, backend.generate(bare, params)), tol)
        before = copy.deepcopy(llm)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in llm.named_parameters():
                if 'vision_tower' in name or 'multi_modal_projector' in name:
                    p.add_(torch.randn(p.shape, generator=gen).to(p) * PERTURB)
        backend.update_weights(llm)
        samples = backend.generate(requests, params)
        after = compare('after the vision push', *_scored(llm, requests, samples),
                        TOLERANCES[torch.bfloat16]['vs_fp32'])
        stale = compare('after the push vs the old vision weights',
                        *_scored(before, requests, samples), tol)
    finally:
        backend.close()
    record('lmdeploy[interns1 images]', {'now': now, 'bare_placeholder': old_form,
                                         'after_vision_push': after, 'vs_old_vision': stale})
    assert now.ok, str(now)
    assert old_form.mean_abs > 3 * now.mean_abs, f'{old_form} vs {now}'
    assert after.ok, str(after)
    assert stale.mean_abs > 10 * after.mean_abs, f'the vision push did not land: {stale} vs {after}'


def test_two_rl_steps_with_images_through_lmdeploy(vlm, tiny_dir, device, tmp_path):
    cfg = write_config(tmp_path, extra=f"""
        model = dict(_delete_=True, type='RLPolicy', pretrained='{vlm / 'model'}',
                     model_class='AutoModelForImageTextToText', torch_dtype='bfloat16',
                     policy_loss=dict(type='CISPOLoss', eps_low=1.0, eps_high=4.0))
        train_dataloader = dict(batch_size=4, dataset=dict(path='{vlm / 'data' / 'train.jsonl'}'))
        train_cfg = dict(
            val=dict(path='{vlm / 'data' / 'train.jsonl'}'),
            rewards=dict(default=dict(_delete_=True, type='ShortAnswerReward', max_len=5)),
            rollout=dict(_delete_=True, type='LMDeployRolloutBackend', timeout_s=300,
                         launch=dict(model_path='{vlm / 'model'}', port=0,
                                     extra_args={SERVER_ARGS!r},
                                     log_file='{tmp_path / 'server.log'}',
                                     startup_timeout_s={STARTUP_S}),
                         weight_sync=dict(mode='ipc'), sleep_wake=True))
    """)
    work = tmp_path / 'work'
    train(cfg, work, tiny_dir, 'train_cfg.max_steps=2', 'train_cfg.val.interval=100',
          'train_cfg.max_tokens_per_micro_batch=800', timeout=580)
    logged = scalars(work)
    tol = TOLERANCES[torch.bfloat16]['logprobs'].atol
    for step in (1, 2):
        row = logged[step]
        assert math.isfinite(row['loss/pg']) and row['rollout/logprob_abs_diff'] <= tol, row
    record('lmdeploy[interns1 rl_step]', {'steps': {s: {k: logged[s][k] for k in (
        'loss/pg', 'rollout/logprob_abs_diff', 'perf/gen_tokens_per_sec') if k in logged[s]}
        for s in (1, 2)}})
