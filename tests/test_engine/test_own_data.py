"""A user's own data through xtuner's training program: GSM8K's fields, no domain, '#### N'."""

import json

from .conftest import scalars, train, write_config


def test_gsm8k_as_published_trains_with_fields_and_default_domain(tmp_path, tiny_dir):
    rows = [{'question': f'{a}+{b}', 'answer': f'{a} plus {b} is {a + b}.\n#### {a + b}'}
            for a in range(1, 5) for b in range(1, 5)]
    data = tmp_path / 'gsm8k.jsonl'
    data.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    cfg = write_config(tmp_path, extra=f"""
        train_dataloader = dict(dataset=dict(
            _delete_=True, type='PromptDataset', path='{data}',
            fields=dict(prompt='question', answer='answer'), default_domain='math',
            required=['answer']))
        train_cfg = dict(rewards=dict(math=dict(type='MathReward')))
    """)
    work = tmp_path / 'run'
    proc = train(cfg, work, tiny_dir, 'train_cfg.max_steps=1', 'train_cfg.val.interval=100')
    logged = scalars(work)
    assert 'reward/mean/math' in logged[1]  # routed by the default domain
    assert logged[1]['reward/errors/math'] == 0, proc.stdout[-3000:]  # '#### N' understood
