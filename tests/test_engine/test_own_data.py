"""A user's own data through xtuner's training program: GSM8K's fields, no domain, '#### N',
for the training file and the held-out files alike."""

import json

from .conftest import scalars, train, write_config
from tests import preloaded


def test_gsm8k_as_published_trains_with_fields_and_default_domain(tmp_path, tiny_dir):
    rows = [{'question': f'{a}+{b}', 'answer': f'{a} plus {b} is {a + b}.\n#### {a + b}'}
            for a in range(1, 5) for b in range(1, 5)]
    data, held_out = tmp_path / 'gsm8k.jsonl', tmp_path / 'gsm8k_test.jsonl'
    data.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    held_out.write_text(''.join(json.dumps(r) + '\n' for r in rows[:6]))
    cfg = write_config(tmp_path, extra=f"""
        train_dataloader = dict(dataset=dict(
            _delete_=True, type='PromptDataset', path='{data}',
            fields=dict(prompt='question', answer='answer'), default_domain='math',
            required=['answer']))
        train_cfg = dict(
            rewards=dict(math=dict(type='MathReward')),
            val=dict(_delete_=True, path='{held_out}', interval=100,
                     fields=dict(prompt='question'), default_domain='math',
                     benchmarks=[dict(name='gsm8k_small', path='{held_out}')]))
    """)
    work = tmp_path / 'run'
    proc = train(cfg, work, tiny_dir, 'train_cfg.max_steps=1')
    logged = scalars(work)
    assert 'reward/mean/math' in logged[1]  # routed by the default domain
    assert logged[1]['reward/errors/math'] == 0, proc.stdout[-3000:]  # '#### N' understood
    # the held-out files read with the same mapping: one metric per domain and per benchmark
    assert {'val/math/acc', 'val/gsm8k_small/acc'} <= set(logged[0]), sorted(logged[0])


def test_check_config_reads_held_out_files_with_their_mapping(tmp_path):
    import sys

    from .conftest import ROOT
    held_out = tmp_path / 'gsm8k_test.jsonl'
    held_out.write_text(json.dumps({'question': '1+1', 'answer': '#### 2'}) + '\n')
    cfg = write_config(tmp_path, extra=f"""
        train_cfg = dict(val=dict(_delete_=True, path='{held_out}', fields=dict(prompt='question'),
                                  default_domain='math'))
    """)
    ok = preloaded.run([sys.executable, 'tools/check_config.py', str(cfg)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert '1 records checked' in ok.stdout, ok.stdout + ok.stderr
    assert 'PROBLEM: train_cfg.val.path' not in ok.stdout
    bad = preloaded.run([sys.executable, 'tools/check_config.py', str(cfg), '--cfg-options',
                         'train_cfg.val.fields=None'], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
    assert f"PROBLEM: train_cfg.val.path: {held_out}:1: field 'prompt': missing" in bad.stdout, \
        bad.stdout + bad.stderr
