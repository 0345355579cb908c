"""``tools/analyze_rollouts.py`` run for real, as a user runs it."""

import importlib.util
import json
import math
import os
import re
import sys
from pathlib import Path

import pytest

from tests import preloaded

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / 'tools' / 'analyze_rollouts.py'


def run_tool(*args, check=True):
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this tree's package, not an installed one
    proc = preloaded.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True,
                         text=True, cwd=ROOT, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f'exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}')
    return proc


def load_tool():
    """The script as a module, to run its ``main`` in-process for the many error cases."""
    spec = importlib.util.spec_from_file_location('analyze_rollouts', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_jsonl(path: Path, records) -> Path:
    path.write_text(''.join((r if isinstance(r, str) else json.dumps(r)) + '\n' for r in records))
    return path


def group(step, pid, domain, rewards, nll=0.5, length=4):
    return [dict(step=step, prompt_id=pid, domain=domain, reward=r, logprobs=[-nll] * length)
            for r in rewards]


def skew_formula(p):
    return (1 - 2 * p) / math.sqrt(p * (1 - p))


def test_appendix_a_single_group_skewness(tmp_path):
    """Paper appendix A: skew = (1-2p)/sqrt(p(1-p)): 0.08, 0.45, 1.86 at p = .48, .39, .16."""
    records = (group(0, 'phys', 'physics', [1.0] * 12 + [0.0] * 13) +  # p = 12/25 = 0.48
               group(0, 'math', 'math', [1.0] * 39 + [0.0] * 61) +  # p = 0.39
               group(0, 'if', 'instruction_following', [1.0] * 4 + [0.0] * 21))  # p = 0.16
    src = write_jsonl(tmp_path / 'r.jsonl', records)
    run_tool(src, '--out', tmp_path / 'out', '--advantage', 'GRPOAdvantage')
    domains = json.loads((tmp_path / 'out' / 'domains.json').read_text())
    for name, p, paper in [('physics', 0.48, 0.08), ('math', 0.39, 0.45),
                           ('instruction_following', 0.16, 1.86)]:
        got = domains[name]['advantage_skewness_before']
        assert got == pytest.approx(skew_formula(p), abs=1e-6)
        assert abs(got - paper) <= 0.01  # the paper rounds 1.855 to 1.86
        assert domains[name]['accuracy'] == pytest.approx(p)
        # binary group: excess kurtosis = (1 - 6p(1-p)) / (p(1-p))
        assert domains[name]['advantage_kurtosis_before'] == pytest.approx(
            (1 - 6 * p * (1 - p)) / (p * (1 - p)), abs=1e-6)


def test_outputs_follow_the_gepo_semantics(tmp_path):
    # step 0: group entropies 0.25 / 0.5 / 0.75 -> mu 0.5, sigma sqrt(1/24)
    recs = []
    for step in (1, 0):  # written out of order: steps must still be replayed 0, 1
        recs += group(step, 'a', 'math', [1.0, 0.0], nll=0.25)
        recs += group(step, 'b', 'physics', [1.0, 0.0], nll=0.5)
        recs += group(step, 'c', 'code', [1.0, 0.0], nll=0.75 if step == 0 else 1.0)
    src = write_jsonl(tmp_path / 'r.jsonl', recs)
    run_tool(src, '--out', tmp_path / 'out', '--cfg-options', 'beta_low=1', 'beta_high=1',
             'gamma=0.5', 'alpha_low=0.5', 'alpha_high=0.2')
    out = tmp_path / 'out'
    thresholds = [json.loads(x) for x in (out / 'thresholds.jsonl').read_text().splitlines()]
    assert [t['step'] for t in thresholds] == [0, 1]
    s0 = math.sqrt(((0.25 - 0.5)**2 + (0.75 - 0.5)**2) / 3)
    assert thresholds[0]['mu'] == pytest.approx(0.5)
    assert thresholds[0]['sigma'] == pytest.approx(s0)
    assert thresholds[0]['h_low'] == pytest.approx(0.5 - s0)  # step 0 uses its own band
    assert thresholds[0]['h_high'] == pytest.approx(0.5 + s0)
    assert thresholds[1]['h_low'] == pytest.approx(0.5 - s0)  # EMA of equal values
    mu1 = (0.25 + 0.5 + 1.0) / 3
    s1 = math.sqrt(sum((h - mu1)**2 for h in (0.25, 0.5, 1.0)) / 3)
    lines = [json.loads(x) for x in (out / 'advantages.jsonl').read_text().splitlines()]
    assert len(lines) == len(recs)
    assert [(x['step'], x['prompt_id'], x['reward']) for x in lines] == \
        [(r['step'], r['prompt_id'], r['reward']) for r in recs]  # input order kept
    a = 0.5 / math.sqrt(0.5)
    by_key = {(x['step'], x['prompt_id'], x['reward']): x for x in lines}
    assert by_key[(0, 'a', 1.0)]['advantage'] == pytest.approx(0.5 * a)  # low entropy, A > 0
    assert by_key[(0, 'a', 0.0)]['advantage'] == pytest.approx(-a)
    assert by_key[(0, 'c', 0.0)]['advantage'] == pytest.approx(-0.2 * a)  # high entropy, A < 0
    assert by_key[(0, 'c', 0.0)]['shaped'] == 'high'
    assert by_key[(0, 'b', 1.0)]['advantage'] == pytest.approx(a)  # inside the band
    assert by_key[(0, 'b', 1.0)]['group_entropy'] == pytest.approx(0.5)
    # step 1 shapes with the band after step 0 (still [0.5 - s0, 0.5 + s0]); 1.0 is above it
    assert by_key[(1, 'c', 0.0)]['advantage'] == pytest.approx(-0.2 * a)
    assert thresholds[1]['mu'] == pytest.approx(mu1) and thresholds[1]['sigma'] == pytest.approx(s1)
    domains = json.loads((out / 'domains.json').read_text())
    assert domains['code']['frac_shaped_high'] == pytest.approx(0.5)
    assert domains['math']['frac_shaped_low'] == pytest.approx(0.5)
    assert domains['physics']['frac_shaped_low'] == 0.0
    for png in ('group_entropy_by_domain.png', 'advantage_by_domain.png', 'thresholds.png'):
        assert (out / png).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_non_gepo_processor_reports_no_thresholds(tmp_path):
    src = write_jsonl(tmp_path / 'r.jsonl', group(0, 'a', 'math', [1.0, 0.0, 0.0]))
    run_tool(src, '--out', tmp_path / 'out', '--advantage', 'RLOOAdvantage')
    t = json.loads((tmp_path / 'out' / 'thresholds.jsonl').read_text())
    assert t['h_low'] is None and t['mu'] == pytest.approx(0.5)


def test_output_and_help_state_how_the_band_starts(tmp_path, capsys):
    src = write_jsonl(tmp_path / 'r.jsonl', group(0, 'a', 'math', [1.0, 0.0, 0.0]))
    assert load_tool().main([str(src), '--out', str(tmp_path / 'out'), '--cfg-options',
                             'gamma=0.02']) == 0
    out = capsys.readouterr().out
    assert "band starts at the first batch's own statistics (H(0) = Hhat(0))" in out
    assert 'with gamma=0.02 that batch still weighs 0.14 in the thresholds at step 100' in out
    with pytest.raises(SystemExit):
        load_tool().main(['--help'])
    assert 'the first step anchors the thresholds for about 100 steps' in ' '.join(
        capsys.readouterr().out.split())
    load_tool().main([str(src), '--out', str(tmp_path / 'rloo'), '--advantage', 'RLOOAdvantage'])
    assert 'H(0)' not in capsys.readouterr().out  # no band, nothing to say


GOOD = json.dumps(dict(step=0, prompt_id='p', domain='math', reward=1.0, logprobs=[-0.1]))


@pytest.mark.parametrize('lines,lineno,message', [
    ([GOOD, '{"step": 0, "prompt_id": "p", "domain": "math", "reward": NaN, "logprobs": []}'],
     2, "field 'reward' must be a finite number"),
    ([GOOD, GOOD.replace('1.0', 'Infinity')], 2, "field 'reward' must be a finite number"),
    ([GOOD, '', '{"step": 0, "prompt_id": "q", "domain": "math", "logprobs": []}'], 3,
     r"missing field\(s\) \['reward'\]"),
    ([GOOD, '{"step": 0, "prompt_id": "q", "domain": "math", "reward": 1,'], 2, 'not valid JSON'),
    (['[1, 2]'], 1, 'expected a JSON object'),
    ([GOOD.replace('[-0.1]', '[-0.1, "x"]')], 1, "'logprobs' must be a list of numbers"),
    ([GOOD.replace('[-0.1]', '[-0.1, 2.5]')], 1, r"'logprobs'\[1\] = 2.5 is not a log-probability"),
    ([GOOD.replace('"step": 0', '"step": "0"')], 1, "'step' must be an integer"),
    ([GOOD, GOOD.replace('math', 'code')], 2, "domain 'code' differs from 'math'.* line 1"),
    ([], 1, 'no rollouts in the file'),
])
def test_bad_input_stops_naming_file_and_line(tmp_path, capsys, lines, lineno, message):
    src = write_jsonl(tmp_path / 'bad.jsonl', lines) if lines else tmp_path / 'bad.jsonl'
    if not lines:
        src.write_text('')
    assert load_tool().main([str(src), '--out', str(tmp_path / 'out')]) == 2
    err = capsys.readouterr().err
    assert f'{src}:{lineno}:' in err
    assert re.search(message, err), err
    assert not (tmp_path / 'out' / 'advantages.jsonl').exists()


def test_bad_input_exit_status_from_the_command_line(tmp_path):
    src = write_jsonl(tmp_path / 'bad.jsonl', [GOOD, '{"oops": 1}'])
    proc = run_tool(src, '--out', tmp_path / 'out', check=False)
    assert proc.returncode == 2 and f'{src}:2: missing field' in proc.stderr


@pytest.mark.parametrize('args,message', [
    (['--advantage', 'NoSuch'], "'NoSuch' is not registered"),
    (['--cfg-options', 'alpha_lo=0.5'], r"\['alpha_lo'\] are not parameters of GEPOAdvantage"),
    (['--cfg-options', 'gamma=2'], r'gamma must be in \(0'),
])
def test_bad_options_are_explained(tmp_path, args, message):
    src = write_jsonl(tmp_path / 'r.jsonl', [GOOD])
    with pytest.raises(SystemExit) as exc:
        load_tool().main([str(src), '--out', str(tmp_path / 'out'), *args])
    assert re.search(message, str(exc.value)), exc.value


def test_gepo_shaped_rloo_reports_its_shaping(tmp_path):
    """A shaper around another estimator: the analyser reads the band from the output,
    and the responses it damps are GEPO-around-GRPO's (same signs, same groups)."""
    records = (group(0, 'a', 'math', [1.0, 0.0, 0.0, 1.0], nll=0.1)
               + group(0, 'b', 'code', [1.0, 0.0, 0.0, 0.0], nll=2.0)
               + group(1, 'c', 'math', [1.0, 1.0, 0.0, 0.0], nll=0.2)
               + group(1, 'd', 'code', [0.0, 1.0, 0.0, 0.0], nll=1.5))
    src = write_jsonl(tmp_path / 'r.jsonl', records)
    proc = run_tool(src, '--out', tmp_path / 'rloo', '--advantage', 'GEPOAdvantage',
                    '--cfg-options', 'base.type=RLOOAdvantage', 'beta_low=0', 'beta_high=0')
    assert 'base=RLOOAdvantage()' in proc.stdout
    run_tool(src, '--out', tmp_path / 'grpo', '--advantage', 'GEPOAdvantage', '--cfg-options',
             'beta_low=0', 'beta_high=0')
    read = lambda d, f: [json.loads(x) for x in (tmp_path / d / f).read_text().splitlines()]  # noqa: E731
    rloo, grpo = read('rloo', 'advantages.jsonl'), read('grpo', 'advantages.jsonl')
    assert [r['shaped'] for r in rloo] == [r['shaped'] for r in grpo]
    assert {r['shaped'] for r in rloo} == {None, 'low', 'high'}
    assert read('rloo', 'thresholds.jsonl') == read('grpo', 'thresholds.jsonl')
    assert all(t['h_low'] is not None for t in read('rloo', 'thresholds.jsonl'))
    # RLOO's raw advantage of a 1-of-4 winner is 1 - 0 = 1; GRPO's is 1.5
    assert rloo[4]['advantage_raw'] == pytest.approx(1.0) and grpo[4]['advantage_raw'] == 1.5
