"""``tools/evaluate.py`` on a tiny random policy whose scores are known in advance.

Every benchmark record's ``answer`` is the policy's own greedy answer for even records and
a wrong one for odd records, so greedy evaluation must score exactly the fraction of even
records, whatever the random weights produce. Resume runs as real subprocesses; the other
cases call the tool's ``main`` in this process (an interpreter start costs ~10 s here).
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from mmengine.config import Config

from gepo_xtuner.testbed.synthetic_tasks import generate_split
from gepo_xtuner.testbed.tiny import build_char_tokenizer, build_tiny_model, greedy_answers
from tests import preloaded

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / 'tools' / 'evaluate.py'
MAX_NEW = 5
spec = importlib.util.spec_from_file_location('evaluate_tool', TOOL)
evaluate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(evaluate)


pytestmark = pytest.mark.usefixtures('one_thread')  # tests/conftest.py


@pytest.fixture(scope='module')
def setup(tmp_path_factory, one_thread) -> dict:
    """Two saved policies (seed 0: evaluated; seed 1: only its architecture used) and
    benchmark ``a`` (8 records, JSONL) and ``b`` (4 records, Parquet) with known scores."""
    out = tmp_path_factory.mktemp('evaluate')
    tok = build_char_tokenizer()
    model = build_tiny_model(len(tok), seed=0)
    for name, m in (('model', model), ('base', build_tiny_model(len(tok), seed=1))):
        m.save_pretrained(out / name)
        tok.save_pretrained(out / name)
    records = generate_split('val', 3, seed=0)  # 12 records, 4 domains
    answers = greedy_answers(model, tok, [r['prompt'] for r in records], max_new_tokens=MAX_NEW)
    for i, (record, answer) in enumerate(zip(records, answers)):
        record['answer'] = answer if i % 2 == 0 else answer + 'x'
    (out / 'a.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records[:8]))
    pd.DataFrame(records[8:]).to_parquet(out / 'b.parquet')
    weights = {'llm.' + k: v for k, v in model.state_dict().items()}
    cfg = Config(dict(model=dict(type='RLPolicy', pretrained=str(out / 'base')),
                      train_cfg=dict(rewards=dict(default=dict(type='ExactMatchReward')),
                                     prompt_template='{prompt}=')))
    torch.save(dict(meta=dict(cfg=cfg.pretty_text), state_dict=weights), out / 'iter_3.pth')
    torch.save(dict(state_dict=weights), out / 'bare.pth')
    return dict(dir=out, expected=dict(a=0.5, b=0.5))


def common(setup: dict, out: Path, *extra: str) -> list[str]:
    d = setup['dir']
    return ['--data', str(d / 'a.jsonl'), f'b={d / "b.parquet"}', '--out', str(out),
            '--max-new-tokens', str(MAX_NEW), '--batch-size', '4', *extra]


def hf(setup: dict, out: Path, *extra: str) -> list[str]:
    return [str(setup['dir'] / 'model'), *common(setup, out, '--rewards',
                                                 'default=ExactMatchReward',
                                                 '--prompt-template', '{prompt}=', *extra)]


def run_tool(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS='1')
    proc = preloaded.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def scores(out: Path) -> dict:
    return json.loads((out / 'scores.json').read_text())['benchmarks']


def completions(out: Path) -> dict:
    return {(r['benchmark'], r['id'], r['sample']): r['completion']
            for name in ('a', 'b') for r in rows(out / f'{name}.samples.jsonl')}


@pytest.fixture(scope='module')
def full_run(setup, tmp_path_factory) -> Path:
    """An uninterrupted greedy run, in process."""
    out = tmp_path_factory.mktemp('full')
    assert evaluate.main(hf(setup, out)) == 0
    return out


def test_greedy_scores_are_the_known_ones(setup, full_run):
    got = scores(full_run)
    for name in ('a', 'b'):
        assert got[name]['acc'] == setup['expected'][name]
        assert got[name]['complete'] and got[name]['errors'] == 0
    assert got['a']['prompts'] == 8 and got['b']['total_prompts'] == 4
    assert set(got['a']['by_domain']) == {'copy', 'add', 'sort'}  # 3 records per domain
    assert set(got['b']['by_data_source']) == {'sort', 'mul'}
    line = rows(full_run / 'a.samples.jsonl')[0]
    assert set(line) == {'benchmark', 'id', 'sample', 'data_source', 'domain', 'prompt',
                         'completion', 'reward', 'error', 'finish_reason', 'response_tokens'}


def test_resume_after_an_interruption_matches_the_uninterrupted_run(setup, full_run, tmp_path):
    out = tmp_path / 'resumed'
    run_tool(hf(setup, out, '--limit', '4'))  # stops after 4 prompts of each benchmark
    first = scores(out)
    assert first['a']['prompts'] == 4 and not first['a']['complete']
    with (out / 'a.samples.jsonl').open('a') as fh:  # killed while writing a line
        fh.write('{"benchmark": "a", "id": "val-mul-0')
    proc = run_tool(hf(setup, out))
    assert 'a: 8 prompts, 4 done before, 4 to do now' in proc.stdout
    for name, total in (('a', 8), ('b', 4)):
        ids = [r['id'] for r in rows(out / f'{name}.samples.jsonl')]
        assert len(ids) == len(set(ids)) == total  # nothing twice, nothing lost
    assert scores(out) == scores(full_run)
    assert completions(out) == completions(full_run)


def test_checkpoint_input_uses_its_weights_rewards_and_template(setup, full_run, tmp_path):
    d = setup['dir']
    out = tmp_path / 'ckpt'
    assert evaluate.main([str(d / 'iter_3.pth'), *common(setup, out)]) == 0
    assert scores(out) == scores(full_run)  # seed-0 weights on the seed-1 base
    assert completions(out) == completions(full_run)
    with pytest.raises(SystemExit, match=r'carries no training config naming model\.pretrained'):
        evaluate.main([str(d / 'bare.pth'), *common(setup, tmp_path / 'bare')])
    out = tmp_path / 'bare_with_base'
    assert evaluate.main([str(d / 'bare.pth'), *common(setup, out, '--base-model',
                                                       str(d / 'base'), '--rewards',
                                                       'default=ExactMatchReward',
                                                       '--prompt-template', '{prompt}=')]) == 0
    assert scores(out) == scores(full_run)


def test_a_checkpoint_answers_within_its_training_length_unless_told(setup, tmp_path):
    d = setup['dir']
    ckpt = torch.load(d / 'iter_3.pth', weights_only=False)
    cfg = Config.fromstring(ckpt['meta']['cfg'], '.py')
    cfg.train_cfg.sampling = dict(max_new_tokens=3)
    torch.save(dict(ckpt, meta=dict(cfg=cfg.pretty_text)), tmp_path / 'iter_4.pth')
    args = ['--data', str(d / 'a.jsonl'), '--limit', '2', '--batch-size', '2']
    for extra, expected in (([], 3), (['--max-new-tokens', '4'], 4)):
        out = tmp_path / f'out{expected}'
        assert evaluate.main([str(tmp_path / 'iter_4.pth'), *args, '--out', str(out),
                              *extra]) == 0
        assert json.loads((out / 'settings.json').read_text())['max_new_tokens'] == expected
        samples = [json.loads(x) for x in (out / 'a.samples.jsonl').read_text().splitlines()]
        assert max(s['response_tokens'] for s in samples) <= expected


def test_avg_at_n_samples_and_refuses_to_mix_settings(setup, tmp_path):
    out = tmp_path / 'sampled'
    assert evaluate.main(hf(setup, out, '--n', '2', '--temperature', '1.0', '--limit',
                            '3')) == 0
    lines = rows(out / 'a.samples.jsonl')
    assert [(r['id'], r['sample']) for r in lines][:2] == [(lines[0]['id'], 0),
                                                           (lines[0]['id'], 1)]
    assert len(lines) == 6
    assert scores(out)['a']['acc'] == pytest.approx(sum(r['reward'] for r in lines) / 6)
    with pytest.raises(SystemExit, match=r'holds results of other settings \(n: 2 -> 1'):
        evaluate.main(hf(setup, out))


def test_lmdeploy_backend_against_the_protocol_double(setup, full_run, tmp_path):
    """NOT LMDeploy (it needs a GPU): the protocol double serves the same tiny policy over
    LMDeploy's /generate protocol, so greedy answers and scores must match the HF run."""
    pytest.importorskip('lmdeploy')
    from tests.test_rollout.protocol_double import LMDeployProtocolDouble
    double = LMDeployProtocolDouble(str(setup['dir'] / 'model')).start()
    try:
        out = tmp_path / 'served'
        assert evaluate.main(hf(setup, out, '--backend', 'lmdeploy', '--server-url',
                                double.url)) == 0
    finally:
        double.stop()
    assert scores(out) == scores(full_run)
    assert completions(out) == completions(full_run)


def test_vision_language_model_on_image_records(tmp_path):
    """A tiny random Qwen2-VL on picture questions (chat turns with an image part)."""
    from gepo_xtuner.testbed.tiny_vl import build_picture_tasks, save_tiny_vl
    model = save_tiny_vl(tmp_path / 'vl', seed=0)
    data = build_picture_tasks(tmp_path / 'data', n=4, name='pictures')
    out = tmp_path / 'out'
    assert evaluate.main([str(model), '--data', str(data), '--out', str(out), '--model-class',
                          'Qwen2VLForConditionalGeneration', '--rewards',
                          'default=ExactMatchReward', '--max-new-tokens', '3']) == 0
    got = scores(out)['pictures']
    assert got['complete'] and got['prompts'] == 4 and got['errors'] == 0
    assert set(got['by_domain']) == {'colour', 'count'}
    assert all(0 < r['response_tokens'] <= 3 for r in rows(out / 'pictures.samples.jsonl'))


def test_bad_inputs_say_what_to_fix(setup, tmp_path):
    d = setup['dir']
    dup = tmp_path / 'dup.jsonl'
    dup.write_text('{"id": 1, "prompt": "1+1", "domain": "add"}\n'
                   '{"id": "1", "prompt": "1+2", "domain": "add"}\n')
    with pytest.raises(SystemExit, match=rf"{dup}:2: field 'id': '1' is already the id of "):
        evaluate.main([str(d / 'model'), '--data', str(dup), '--out', str(tmp_path / 'o'),
                       '--rewards', 'default=ExactMatchReward'])
    with pytest.raises(SystemExit, match='no rewards given'):
        evaluate.main([str(d / 'model'), *common(setup, tmp_path / 'o')])
    with pytest.raises(SystemExit, match="'math' is not DOMAIN=Type"):
        evaluate.main([str(d / 'model'), *common(setup, tmp_path / 'o', '--rewards', 'math')])
    with pytest.raises(SystemExit, match='NoSuchReward'):
        evaluate.main([str(d / 'model'), *common(setup, tmp_path / 'o', '--rewards',
                                                 'default=NoSuchReward')])
    with pytest.raises(SystemExit):  # argparse: usage error, exit status 2
        evaluate.main([str(d / 'model'), *common(setup, tmp_path / 'o', '--backend',
                                                 'lmdeploy')])
