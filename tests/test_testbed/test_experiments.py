"""Tables and verdicts of the method comparison, on hand-written run histories."""

import math

import pytest

from gepo_xtuner.testbed.experiments import (compare, mean_std, plot_figures, results_markdown,
                                              summarize_run)


def history(val: dict[int, tuple[float, float]], entropy: dict[str, float] | None = None,
            steps: int = 8) -> list[dict]:
    """A run over ``steps`` steps; ``val[step] = (acc of add, acc of mul)``."""
    rows = []
    for step in range(steps + 1):
        row = {'step': float(step)}
        if step:
            row['entropy/policy'] = 0.1 * step
            for d, h in (entropy or {'add': 0.5, 'mul': 0.9}).items():
                row[f'entropy/group_nll/{d}'] = h
        if step in val:
            add, mul = val[step]
            row.update({'val/add/acc': add, 'val/mul/acc': mul, 'val/acc': (add + mul) / 2})
        rows.append(row)
    return rows


def test_summary_picks_best_and_final_validation_and_measures_curves():
    s = summarize_run(history({0: (0.2, 0.0), 4: (0.6, 0.4), 8: (0.5, 0.1)}))
    assert s['domains'] == ['add', 'mul']  # the task mix's order, not alphabetical
    assert s['start'] == pytest.approx({'add': 0.2, 'mul': 0.0, 'avg': 0.1})
    assert s['best'] == pytest.approx({'add': 0.6, 'mul': 0.4, 'avg': 0.5})
    assert s['final'] == pytest.approx({'add': 0.5, 'mul': 0.1, 'avg': 0.3})
    assert (s['best_step'], s['final_step']) == (4, 8)
    assert s['late_drop'] == pytest.approx(0.2)
    assert s['gain_min'] == pytest.approx(0.1)  # add +0.3, mul +0.1
    assert s['gain_spread'] == pytest.approx(0.1)
    assert s['oscillation'] == pytest.approx((0.4 + 0.2) / 2)
    # last quarter of 8 steps: steps 7 and 8
    assert s['entropy_policy_tail'] == pytest.approx(0.75)
    assert s['entropy_policy_max'] == pytest.approx(0.8)
    assert s['group_entropy_tail'] == pytest.approx({'add': 0.5, 'mul': 0.9})
    assert s['group_entropy_spread'] == pytest.approx(0.2)  # population std of 0.5, 0.9


def test_summary_refuses_runs_without_validation():
    with pytest.raises(ValueError, match='train_cfg.val'):
        summarize_run([{'step': 1.0, 'entropy/policy': 0.3}])


def test_seed_noise_verdict_is_a_two_standard_error_band():
    assert mean_std([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1.0))
    assert math.isnan(mean_std([1.0])[1])
    # se = sqrt(1/3 + 1/3) = 0.816: a difference of 1.5 is within 2 se, 2.0 beyond
    assert compare([2.5, 3.5, 4.5], [1.0, 2.0, 3.0])['beyond_noise'] is False
    c = compare([3.0, 4.0, 5.0], [1.0, 2.0, 3.0])
    assert c['diff'] == pytest.approx(2.0) and c['se'] == pytest.approx(math.sqrt(2 / 3))
    assert c['beyond_noise'] is True
    assert compare([3.0], [1.0, 2.0])['beyond_noise'] is None  # one seed: no noise estimate


def test_results_table_has_mean_std_bold_best_verdicts_and_ablations(tmp_path):
    runs = {
        'grpo': [history({0: (0.2, 0.0), 8: (0.3, 0.1)}), history({0: (0.2, 0.0), 8: (0.3, 0.3)})],
        'gepo': [history({0: (0.2, 0.0), 8: (0.5, 0.1)}), history({0: (0.2, 0.0), 8: (0.5, 0.3)})],
        'gepo_wo_low': [history({0: (0.2, 0.0), 8: (0.4, 0.2)})],
    }
    summaries = {m: [summarize_run(h) for h in hs] for m, hs in runs.items()}
    text = results_markdown(summaries, ['grpo', 'gepo', 'gepo_wo_low'], header='# title')
    table1 = text.split('## Table 1')[1].split('###')[0]
    grpo_row = next(line for line in table1.splitlines() if line.startswith('| GRPO'))
    gepo_row = next(line for line in table1.splitlines() if line.startswith('| GEPO |'))
    # final avg: GRPO (0.2, 0.3) -> 0.250 ± 0.071, GEPO (0.3, 0.4) -> 0.350 ± 0.071, in bold
    assert '0.250 ± 0.071' in grpo_row and '**0.350 ± 0.071**' in gepo_row
    assert '| 0.300 ± 0.000 |' in grpo_row and '**0.500 ± 0.000**' in gepo_row  # add
    assert '**0.200 ± 0.141**' in grpo_row and '**0.200 ± 0.141**' in gepo_row  # mul: a tie
    assert 'w/o low' not in table1  # the ablations go to Table 2
    verdict = next(line for line in text.splitlines() if line.startswith('- GEPO: final avg'))
    # diff 0.1, se = sqrt(0.005/2 * 2) = 0.0707: within 2 se
    assert '+0.100 vs GRPO' in verdict and 'within seed noise' in verdict
    table2 = text.split('## Table 2')[1]
    assert '| GEPO w/o low | 1 |' in table2
    assert 'no noise estimate' in table2
    paths = plot_figures(runs, ['grpo', 'gepo', 'gepo_wo_low'], tmp_path, smooth=2)
    assert [p.name for p in paths] == ['fig3_validation.png', 'fig4_policy_entropy.png',
                                      'fig5_group_entropy.png']
    assert all(p.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' for p in paths)
