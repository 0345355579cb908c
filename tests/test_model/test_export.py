"""``tools/export_hf.py``: an RL checkpoint becomes a ``from_pretrained`` directory that
generates the trained policy's greedy tokens, for a text and a vision-language policy.

The checkpoints hold the weights of a model with another seed than the base directory
they name, so an export that took any weight from the base directory would generate
other tokens and fail the comparison.
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from PIL import Image
from safetensors.torch import load_file
from transformers import (AutoModelForCausalLM, AutoProcessor, AutoTokenizer,
                          Qwen2VLForConditionalGeneration)

from gepo_xtuner.model.checkpoint import load_for_inference
from gepo_xtuner.testbed.tiny import build_char_tokenizer, build_tiny_model, format_prompt
from gepo_xtuner.testbed.tiny_vl import build_vl_tokenizer, build_tiny_vl_model, draw_squares, \
    save_tiny_vl

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location('export_hf_tool', ROOT / 'tools' / 'export_hf.py')
export_tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(export_tool)
VL_CLASS = 'Qwen2VLForConditionalGeneration'


def save_checkpoint(path: Path, model: torch.nn.Module, model_cfg: dict) -> Path:
    """An ``iter_N.pth`` as the RL runner writes it: ``llm.*`` weights and the config."""
    cfg = Config(dict(model=dict(type='RLPolicy', **model_cfg)))
    weights = {'llm.' + k: v for k, v in model.state_dict().items()}
    torch.save(dict(meta=dict(cfg=cfg.pretty_text), state_dict=weights), path)
    return path


def greedy(model: torch.nn.Module, inputs: dict, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` greedy new tokens (no EOS stop) ``(B, n)`` and their logits ``(n, B, V)``.

    (Random tiny models often repeat one token, so the logits tell models apart.)
    """
    out = model.generate(**inputs, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                         return_dict_in_generate=True, output_logits=True)
    return out.sequences[:, inputs['input_ids'].shape[1]:], torch.stack(out.logits)


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_text_policy_round_trip(tmp_path, dtype):
    tok = build_char_tokenizer()
    build_tiny_model(len(tok), seed=0).save_pretrained(tmp_path / 'base')
    tok.save_pretrained(tmp_path / 'base')
    trained = build_tiny_model(len(tok), seed=1).to(getattr(torch, dtype))
    ckpt = save_checkpoint(tmp_path / 'iter_2.pth', trained,
                           dict(pretrained=str(tmp_path / 'base'), torch_dtype=dtype))

    assert export_tool.main([str(ckpt), '--out', str(tmp_path / 'hf')]) == 0
    out = tmp_path / 'hf'
    for name in ('config.json', 'generation_config.json', 'model.safetensors',
                 'tokenizer.json', 'tokenizer_config.json'):
        assert (out / name).is_file(), name
    saved = load_file(out / 'model.safetensors')
    expected = trained.state_dict()
    assert {v.dtype for v in saved.values()} == {getattr(torch, dtype)}  # the trained dtype
    for k, v in saved.items():
        assert torch.equal(v, expected[k]), k

    model = AutoModelForCausalLM.from_pretrained(out, torch_dtype='auto').eval()
    reference = load_for_inference(str(ckpt), torch_dtype=None)
    assert model.dtype == reference.model.dtype == getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompts = [format_prompt(p) for p in ('12+7', 'sort 3 1 2', 'copy abc')]
    enc = tokenizer(prompts, return_tensors='pt', padding=True)
    assert torch.equal(enc['input_ids'], reference.tokenizer(prompts, return_tensors='pt',
                                                             padding=True)['input_ids'])
    (ours, logits), (theirs, expected_logits) = greedy(model, enc), greedy(reference.model, enc)
    assert torch.equal(ours, theirs) and torch.equal(logits, expected_logits)
    base = AutoModelForCausalLM.from_pretrained(tmp_path / 'base').to(getattr(torch, dtype))
    assert not torch.equal(greedy(base, enc)[1], logits), 'the base weights score the same'


def test_vision_language_policy_round_trip(tmp_path):
    save_tiny_vl(tmp_path / 'base', seed=0)
    trained = build_tiny_vl_model(build_vl_tokenizer(), seed=1)
    ckpt = save_checkpoint(tmp_path / 'iter_3.pth', trained,
                           dict(pretrained=str(tmp_path / 'base'), model_class=VL_CLASS))
    out = tmp_path / 'hf'
    assert export_tool.main([str(ckpt), '--out', str(out)]) == 0
    assert (out / 'preprocessor_config.json').is_file()
    assert json.loads((out / 'config.json').read_text())['architectures'] == [VL_CLASS]

    processor = AutoProcessor.from_pretrained(out)
    model = Qwen2VLForConditionalGeneration.from_pretrained(out).eval()
    reference = load_for_inference(str(ckpt))
    image = Image.open(draw_squares(tmp_path / 'sq.png', 'red', 2, size=(84, 56)))
    messages = [{'role': 'user', 'content': [{'type': 'image'},
                                             {'type': 'text', 'text': 'how many squares?'}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    assert text == reference.processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = dict(processor(text=[text], images=[image], return_tensors='pt'))
    (ours, logits), (theirs, expected_logits) = (greedy(model, inputs),
                                                 greedy(reference.model, inputs))
    assert torch.equal(ours, theirs) and torch.equal(logits, expected_logits)
    base = Qwen2VLForConditionalGeneration.from_pretrained(tmp_path / 'base').eval()
    assert not torch.equal(greedy(base, inputs)[1], logits), 'the base weights score the same'


def test_export_errors_name_the_fix(tmp_path, capsys):
    tok = build_char_tokenizer()
    model = build_tiny_model(len(tok), seed=0)
    ckpt = save_checkpoint(tmp_path / 'iter_1.pth', model,
                           dict(pretrained=str(tmp_path / 'moved_away')))
    assert export_tool.main([str(ckpt), '--out', str(tmp_path / 'hf')]) == 1
    assert '--base-model' in capsys.readouterr().err
    assert not (tmp_path / 'hf').exists()
    model.save_pretrained(tmp_path / 'base')
    tok.save_pretrained(tmp_path / 'base')
    assert export_tool.main([str(ckpt), '--out', str(tmp_path / 'hf'), '--base-model',
                             str(tmp_path / 'base'), '--dtype', 'float33']) == 1
    assert 'unknown dtype' in capsys.readouterr().err
