"""``HFExportHook`` in a real ``xtuner train`` run: the directories it writes equal
``tools/export_hf.py``'s export of the final checkpoint, weight for weight, and generate
the trained policy's greedy tokens after ``from_pretrained``."""

import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from gepo_xtuner.model.checkpoint import load_for_inference
from gepo_xtuner.testbed.tiny import format_prompt

from .conftest import ROOT, train, write_config
from tests import preloaded


def test_export_at_intervals_and_end_equals_the_checkpoint_export(tiny_dir, tmp_path):
    cfg = write_config(tmp_path, extra="""
        custom_hooks = [dict(type='HFExportHook', interval=1, max_keep=1)]
    """)
    work = tmp_path / 'run'
    train(cfg, work, tiny_dir, 'train_cfg.max_steps=2', 'train_cfg.val=None')
    assert (work / 'hf').is_dir() and (work / 'hf_iter_2').is_dir()
    assert not (work / 'hf_iter_1').exists()  # max_keep=1

    out = tmp_path / 'exported'
    proc = preloaded.run([sys.executable, str(ROOT / 'tools' / 'export_hf.py'),
                          str(work / 'iter_2.pth'), '--out', str(out)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tool = load_file(out / 'model.safetensors')
    for hook_dir in (work / 'hf', work / 'hf_iter_2'):
        hooked = load_file(hook_dir / 'model.safetensors')
        assert hooked.keys() == tool.keys()
        assert all(torch.equal(hooked[k], tool[k]) for k in tool)
    start = load_file(tiny_dir / 'model' / 'model.safetensors')
    assert any(not torch.equal(start[k], tool[k]) for k in tool), 'training changed nothing'

    trained = load_for_inference(str(work / 'iter_2.pth'))
    model = AutoModelForCausalLM.from_pretrained(work / 'hf').eval()
    tokenizer = AutoTokenizer.from_pretrained(work / 'hf')
    enc = tokenizer([format_prompt(p) for p in ('3+4', 'sort 9 2 5')], return_tensors='pt',
                    padding=True)
    gen = dict(do_sample=False, max_new_tokens=8, min_new_tokens=8)
    assert torch.equal(model.generate(**enc, **gen), trained.model.generate(**enc, **gen))
