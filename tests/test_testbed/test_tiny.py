"""The tiny policy: tokenizer, model, batches, greedy decoding and the cached warm start."""

import doctest
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from gepo_xtuner.testbed import synthetic_tasks
from gepo_xtuner.testbed.synthetic_tasks import DOMAINS, TASK_CHARS, generate_split, read_jsonl
from gepo_xtuner.testbed import tiny
from gepo_xtuner.testbed.tiny import (ALPHABET, answer_loss, build_char_tokenizer, build_sft_batch,
                                    build_tiny_model, format_prompt, greedy_accuracy,
                                    greedy_answers, load_tiny, read_warm_start_report, warm_start)
from tests import preloaded

ROOT = Path(__file__).resolve().parents[2]
# Enough steps for prompt-dependent (still wrong) answers, in about two seconds.
SMALL = dict(seed=0, steps=60, batch_size=32, lr=1e-2, n_train_per_domain=40,
             n_val_per_domain=8)


pytestmark = pytest.mark.usefixtures('one_thread')  # tests/conftest.py


@pytest.fixture(scope='module')
def warm(one_thread, tmp_path_factory) -> Path:
    """One small warm start shared by the read-only tests."""
    return warm_start(tmp_path_factory.mktemp('warm'), **SMALL)


def state(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_tiny(model_dir)[0].state_dict()


def test_tokenizer_round_trips_every_task_character():
    tok = build_char_tokenizer()
    assert set(TASK_CHARS) | set('= ') <= set(ALPHABET)
    for rec in generate_split('train', 50, 0) + generate_split('val', 50, 0):
        text = format_prompt(rec['prompt']) + rec['answer']
        ids = tok(text)['input_ids']
        assert ids[0] == tok.bos_token_id and len(ids) == len(text) + 1  # one token per char
        assert tok.unk_token_id not in ids
        assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(tok(' a b ')['input_ids'], skip_special_tokens=True) == ' a b '
    assert tok('é')['input_ids'][1] == tok.unk_token_id


def test_tokenizer_save_load_offline(tmp_path, monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    tok = build_char_tokenizer()
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = 'sort:qkzdwe=dekqwz'
    assert loaded(text)['input_ids'] == tok(text)['input_ids']
    assert (loaded.pad_token, loaded.bos_token, loaded.eos_token) == ('<pad>', '<bos>', '<eos>')
    assert loaded.padding_side == 'left' and len(loaded) == len(tok)


def test_left_padding():
    tok = build_char_tokenizer()
    enc = tok([format_prompt('1+2'), format_prompt('copy:abcdef')], padding=True,
              return_tensors='pt')
    assert set(enc) == {'input_ids', 'attention_mask'}  # Qwen2 rejects token_type_ids
    short = enc['input_ids'][0].tolist()
    assert short[:8] == [tok.pad_token_id] * 8 and short[8] == tok.bos_token_id
    assert enc['attention_mask'][0].tolist() == [0] * 8 + [1] * 5
    assert enc['input_ids'][:, -1].tolist() == [tok.convert_tokens_to_ids('=')] * 2


def test_build_tiny_model_is_seeded_small_and_tied():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b, c = (build_tiny_model(60, seed) for seed in (0, 0, 1))
    assert torch.equal(torch.rand(1), before)  # the global RNG is left alone
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    assert a.lm_head.weight is a.model.embed_tokens.weight
    assert all(p.dtype == torch.float32 for p in a.parameters())
    assert sum(p.numel() for p in a.parameters()) < 1_000_000
    assert build_tiny_model(60, 0, num_hidden_layers=1).config.num_hidden_layers == 1


def test_sft_batch_supervises_only_answer_and_eos():
    tok = build_char_tokenizer()
    recs = [{'prompt': '7*23', 'answer': '161'}, {'prompt': 'copy:abcdef', 'answer': 'abcdef'}]
    batch = build_sft_batch(tok, recs)
    first = batch['labels'][0][batch['labels'][0] != -100].tolist()
    assert first == tok('161', add_special_tokens=False)['input_ids'] + [tok.eos_token_id]
    assert batch['attention_mask'][0].tolist() == [1] * 10 + [0] * 10  # right-padded
    assert (batch['labels'][batch['attention_mask'] == 0] == -100).all()
    assert batch['input_ids'][1, 0] == tok.bos_token_id


def test_greedy_batched_matches_one_by_one_and_scores(warm):
    model, tok = load_tiny(warm)
    recs = generate_split('val', 4, 1)
    prompts = [r['prompt'] for r in recs]
    batched = greedy_answers(model, tok, prompts, batch_size=16)
    assert batched == [greedy_answers(model, tok, [p])[0] for p in prompts]
    assert len(set(batched)) > 3  # answers depend on the prompt, so padding is exercised
    own = [dict(r, answer=a) for r, a in zip(recs, batched)]
    assert greedy_accuracy(model, tok, own, batch_size=5) == {d: 1.0 for d in DOMAINS}
    wrong = [dict(r, answer=a + 'x') for r, a in zip(recs, batched)]
    assert greedy_accuracy(model, tok, wrong) == {d: 0.0 for d in DOMAINS}


def test_warm_start_writes_files_and_learns(warm):
    data = warm.parent / 'data'
    assert read_jsonl(data / 'train.jsonl') == generate_split('train', 40, 0)
    assert read_jsonl(data / 'val.jsonl') == generate_split('val', 8, 0)
    report = read_warm_start_report(warm)
    assert report['params']['steps'] == 60 and set(report['val_accuracy']) == set(DOMAINS)
    model, tok = load_tiny(warm)
    assert tok.padding_side == 'left'
    val = read_jsonl(data / 'val.jsonl')
    untrained = answer_loss(build_tiny_model(len(tok), seed=0), tok, val)
    assert answer_loss(model, tok, val) < untrained - 0.5


def test_warm_start_is_deterministic(warm, tmp_path):
    again = warm_start(tmp_path, **SMALL)
    first, second = state(warm), state(again)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    other = state(warm_start(tmp_path / 'seed1', **{**SMALL, 'seed': 1}))
    assert not torch.equal(first['model.embed_tokens.weight'], other['model.embed_tokens.weight'])


def test_warm_start_cache_and_force(warm, tmp_path):
    out = tmp_path / 'copy'
    shutil.copytree(warm.parent, out)
    report_file = out / 'model' / 'warm_start.json'
    mtime, report = report_file.stat().st_mtime_ns, json.loads(report_file.read_text())
    (out / 'data' / 'val.jsonl').unlink()

    assert warm_start(out, **SMALL) == out / 'model'  # cache hit
    assert report_file.stat().st_mtime_ns == mtime
    assert read_jsonl(out / 'data' / 'val.jsonl') == generate_split('val', 8, 0)  # restored

    assert warm_start(out, **SMALL, force=True) == out / 'model'
    retrained = read_warm_start_report(out / 'model')
    assert retrained['trained_at'] > report['trained_at']
    assert retrained['val_accuracy'] == report['val_accuracy']
    assert not [p for p in out.iterdir() if p.name.startswith('.model.')]  # temp dirs gone


def test_warm_start_cache_follows_the_task_generators(warm, tmp_path, monkeypatch):
    out = tmp_path / 'copy'
    shutil.copytree(warm.parent, out)
    before = read_warm_start_report(out / 'model')
    monkeypatch.setattr(synthetic_tasks, 'VAL_BUCKETS', 7)  # a changed train/val split
    warm_start(out, **SMALL)
    after = read_warm_start_report(out / 'model')
    assert after['trained_at'] > before['trained_at']
    assert after['params']['data_sha256'] != before['params']['data_sha256']
    assert read_jsonl(out / 'data' / 'val.jsonl') == generate_split('val', 8, 0)


def test_failed_warm_start_leaves_no_model(warm, tmp_path):
    diverge = {**SMALL, 'lr': 1e30}  # NaN after the first update: fails mid-training
    with pytest.raises(FloatingPointError, match='diverged'):
        warm_start(tmp_path / 'fresh', **diverge)
    assert not (tmp_path / 'fresh' / 'model').exists()
    assert [p.name for p in (tmp_path / 'fresh').iterdir()] == ['data']

    out = tmp_path / 'existing'
    shutil.copytree(warm.parent, out)
    before = (out / 'model' / 'warm_start.json').read_text()
    torch.set_num_threads(2)
    try:
        with pytest.raises(FloatingPointError):
            warm_start(out, **diverge)  # other params: a retrain, which fails
        assert torch.get_num_threads() == 2  # warm_start's one-thread setting is undone
    finally:
        torch.set_num_threads(1)
    assert (out / 'model' / 'warm_start.json').read_text() == before  # old model intact
    assert sorted(p.name for p in out.iterdir()) == ['data', 'model']
    assert not torch.are_deterministic_algorithms_enabled()  # global state restored


def test_prepare_tool_trains_then_reuses(tmp_path, capsys):
    tool = ROOT / 'tools' / 'prepare_tiny_cpu.py'
    args = ['--out', str(tmp_path), '--steps', '3', '--n-train', '5', '--n-val', '2']
    # Once as a user runs it, then in-process (a second interpreter start costs seconds).
    first = preloaded.run([sys.executable, str(tool), *args], capture_output=True, text=True,
                          cwd=ROOT, check=True).stdout
    assert 'warm start took' in first and f'model: {tmp_path / "model"}' in first
    progress = [line for line in first.splitlines() if line.startswith('warm start: step ')]
    assert [line.split(',')[0] for line in progress] == [
        'warm start: step 1/3', 'warm start: step 2/3', 'warm start: step 3/3']
    assert all(f'  {d:<6} ' in first for d in DOMAINS)
    spec = importlib.util.spec_from_file_location('prepare_tiny_cpu', tool)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(args) == 0
    second = capsys.readouterr().out
    assert 'reused cached warm start' in second and str(tmp_path / 'data' / 'val.jsonl') in second


def test_doctests():
    assert doctest.testmod(tiny).failed == 0
