"""Smoke test of ``benchmarks/bench_rl_step.py`` on a very small model (TRL skipped)."""

import os
import re
import sys
from pathlib import Path

from tests import preloaded

ROOT = Path(__file__).resolve().parents[2]


def test_bench_rl_step_prints_every_variant_and_the_ratios(tmp_path: Path) -> None:
    proc = preloaded.run(
        [sys.executable, str(ROOT / 'benchmarks' / 'bench_rl_step.py'), '--skip-trl',
         '--responses', '6', '--median-length', '8', '--max-length', '32', '--hidden', '64',
         '--layers', '1', '--vocab', '128', '--max-tokens', '64', '--rounds', '1',
         '--peak-tflops', '0.05', '--work-dir', str(tmp_path)],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
        timeout=300)
    assert proc.returncode == 0, f'{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}'
    lines = proc.stdout.strip().splitlines()
    for name in ('floor', 'ours', 'padded'):
        assert any(re.match(rf'{name} +median_s=\S+ .* tokens_per_s=\d+ +peak_extra_mib=\d+ '
                            r'+mfu=\d\.\d{4}$', line) for line in lines), (name, proc.stdout)
    assert re.search(r'useful FLOPs of the step: \S+ .* peak 0.05 TFLOP/s', proc.stdout)
    assert re.fullmatch(r'ratio_ours_over_floor=\d+\.\d+ ratio_padded_over_ours=\d+\.\d+ '
                        r'ratio_trl_over_ours=nan', lines[-1]), lines[-1]


def test_bench_rl_step_runs_a_given_model_and_times_the_rollout(tmp_path: Path) -> None:
    from gepo_xtuner.testbed.tiny import build_char_tokenizer, build_tiny_model
    tok = build_char_tokenizer()
    build_tiny_model(len(tok), seed=0).save_pretrained(tmp_path / 'model')
    tok.save_pretrained(tmp_path / 'model')
    proc = preloaded.run(
        [sys.executable, str(ROOT / 'benchmarks' / 'bench_rl_step.py'), '--skip-trl',
         '--model', str(tmp_path / 'model'), '--prompt-lengths', '20', '30',
         '--responses', '4', '--median-length', '8', '--max-length', '16', '--max-tokens', '96',
         '--rounds', '1', '--rollout-tokens', '3', '--work-dir', str(tmp_path / 'work')],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
        timeout=300)
    assert proc.returncode == 0, f'{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}'
    out = proc.stdout
    assert f'qwen2 from {tmp_path / "model"}' in out, out
    lo, hi = map(int, re.search(r'prompts (\d+)-(\d+)', out).groups())
    assert 20 <= lo <= hi <= 30, out
    # every prompt sampled exactly 3 tokens (no stop token)
    assert re.search(r'rollout +HFRolloutBackend 4 prompts x 3 new tokens: \S+s +'
                     r'generated_tokens_per_s=\d+\.\d', out), out
    assert out.strip().splitlines()[-1].startswith('ratio_ours_over_floor=')
