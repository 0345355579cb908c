"""The run-health checks over metric series: each fires at the step its condition starts to
hold, not before, and not on the same series without the cause; state round trips."""

import copy
import math

import pytest

from gepo_xtuner.analysis.health import (ClipFraction, EntropyBounds, GEPOBandActivity,
                                         LengthCollapse, LogprobMismatch, RewardWithoutValidation,
                                         build_checks)


def first_step(check, rows) -> tuple[int, list] | None:
    """``(step, findings)`` of the first step with a finding, or None."""
    for step, row in enumerate(rows, start=1):
        found = check.observe(step, row)
        if found:
            return step, found
    return None


def lengths(values, domain='add', reward=None):
    return [{f'response/length/{domain}': v,
             f'reward/mean/{domain}': (reward[i] if reward else 0.5)}
            for i, v in enumerate(values)]


def test_length_collapse_fires_when_the_smoothed_length_halves_and_names_reward_and_val():
    values = [10.0] * 10 + [10 - 1.5 * i for i in range(1, 7)]  # 8.5, 7, 5.5, 4, 2.5, 1
    rewards = [0.2] * 10 + [0.3 + 0.1 * i for i in range(6)]
    rows = lengths(values, reward=rewards)
    rows[5]['val/add/acc'] = 0.6
    rows[13]['val/add/acc'] = 0.4
    step, found = first_step(LengthCollapse(drop=0.5, window=20, smooth=3), rows)
    # smoothed means: step 14: (7 + 5.5 + 4) / 3 = 5.5; step 15: (5.5 + 4 + 2.5) / 3 = 4 < 5
    assert step == 15
    (f, ) = found
    assert (f.alarm, f.domain) == ('length_collapse', 'add')
    assert 'reward/mean/add 0.2 -> 0.7' in f.message and 'val/add/acc' in f.message
    assert first_step(LengthCollapse(), lengths([10.0] * 16)) is None


def test_length_collapse_forgets_a_peak_older_than_the_window():
    slow = [10.0 * 0.97**i for i in range(60)]  # halves over 23 steps, never within 5
    assert first_step(LengthCollapse(window=5, smooth=1), lengths(slow)) is None
    assert first_step(LengthCollapse(window=40, smooth=1), lengths(slow))[0] == 24


def test_entropy_collapse_and_runaway_relative_to_the_start_level():
    key = 'entropy/group_nll/mul'
    falling = [{key: 1.0}] * 5 + [{key: 1.0 - 0.1 * i} for i in range(1, 10)]
    step, (f, ) = first_step(EntropyBounds(low=0.5, smooth=1), falling)
    assert (step, f.alarm, f.domain) == (11, 'entropy_collapse', 'mul')  # 0.4 < 0.5
    rising = [{key: 0.2}] * 5 + [{key: 0.2 + 0.25 * i} for i in range(1, 10)]
    step, (f, ) = first_step(EntropyBounds(high=3.0, smooth=1), rising)
    assert (step, f.alarm) == (7, 'entropy_runaway')  # 0.7 > 3 x 0.2
    steady = [{key: 0.5 + 0.02 * (-1)**i} for i in range(30)]
    assert first_step(EntropyBounds(), steady) is None
    small = [{key: 0.05}] * 5 + [{key: 0.01}] * 10  # 5x down but 0.04 nats: noise
    assert first_step(EntropyBounds(), small) is None


def band_row(pos, neg, zero=0.2):
    return {'band/low': 0.4, 'band/high': 0.6, 'shaping/frac_damped_pos': pos,
            'shaping/frac_damped_neg': neg, 'adv/frac_zero': zero,
            'entropy/group_nll_mean': 0.5, 'entropy/group_nll_std': 0.1,
            'entropy/group_nll/add': 0.45, 'entropy/group_nll/mul': 0.55}


def test_gepo_silent_names_the_side_and_saturated_counts_signal_responses():
    rows = [band_row(0.0, 0.1)] * 6
    step, (f, ) = first_step(GEPOBandActivity(silent_steps=4), rows)
    assert (step, f.alarm) == (4, 'gepo_silent') and 'side low' in f.message
    assert 'band [0.4, 0.6]' in f.message and '0.45..0.55' in f.message
    no_signal = [band_row(0.0, 0.0, zero=1.0)] * 6  # nothing could be damped: no verdict
    assert first_step(GEPOBandActivity(silent_steps=4), no_signal) is None
    assert first_step(GEPOBandActivity(silent_steps=4), [band_row(0.1, 0.1)] * 6) is None
    full = [band_row(0.3, 0.2, zero=0.5)] * 6 + [band_row(0.1, 0.1)]  # 0.5 / 0.5 = 100 %
    step, (f, ) = first_step(GEPOBandActivity(saturated_steps=3), full)
    assert (step, f.alarm) == (3, 'gepo_saturated')
    no_band = [{**band_row(0.0, 0.0), 'band/low': math.nan}] * 30  # GRPO: no band
    assert first_step(GEPOBandActivity(silent_steps=4), no_band) is None


def test_the_band_check_reads_the_band_any_shaper_logs():
    """The loop logs every shaper's band as ``band/low|high`` (GEPO's also as
    ``gepo/h_low|high``): the check watches that name, not GEPO's."""
    from gepo_xtuner.advantage.base import BAND_KEYS
    assert BAND_KEYS == ('band/low', 'band/high')
    gepo_names_only = {k: v for k, v in band_row(0.0, 0.1).items() if not k.startswith('band/')}
    gepo_names_only.update({'gepo/h_low': 0.4, 'gepo/h_high': 0.6})
    assert first_step(GEPOBandActivity(silent_steps=4), [gepo_names_only] * 6) is None
    step, (f, ) = first_step(GEPOBandActivity(silent_steps=4), [band_row(0.0, 0.1)] * 6)
    assert (step, f.alarm) == (4, 'gepo_silent')


def test_gepo_saturated_defaults_one_sign_per_group_and_steps_without_signal():
    # K=8, every group with signal above the band with one winner: 7/8 of those damped
    above = band_row(0.0, 0.4375, zero=0.5)
    rows = [above] * 3 + [band_row(0.0, 0.0, zero=1.0)] + [above] * 3
    check = GEPOBandActivity()
    found = [[f.alarm for f in check.observe(step, row)] for step, row in enumerate(rows, 1)]
    # the step without signal counts for nothing and keeps the alarm, once it holds
    assert found == [[]] * 5 + [['gepo_saturated']] * 2
    (f, ) = check.observe(8, band_row(0.0, 0.0, zero=1.0))
    assert f.alarm == 'gepo_saturated' and 'no signal at this step; before it at least 70%' in f.message
    # the highest share of a 150-step run of configs/gepo_tiny_cpu.py (0.695), all along
    assert first_step(GEPOBandActivity(), [band_row(0.2, 0.1475, zero=0.5)] * 30) is None


@pytest.mark.parametrize('cls,key,bound', [(LogprobMismatch, 'rollout/logprob_abs_diff', 0.1),
                                           (ClipFraction, 'loss/clipfrac', 0.2)])
def test_bounds_need_patience_steps_in_a_row(cls, key, bound):
    rows = [{key: bound * 2}, {key: bound * 2}, {key: bound / 2}] + [{key: bound * 2}] * 3
    step, (f, ) = first_step(cls(), rows)
    assert step == 6 and f.alarm == cls.alarm
    assert first_step(cls(), [{key: bound}] * 10) is None  # at the bound is fine


def test_reward_without_val_needs_falling_validations_and_rising_reward():
    def run(vals, rewards, interval=5):
        rows = []
        for i, v in enumerate(vals):
            for _ in range(interval if i else 0):
                rows.append({'reward/mean': rewards[i], 'reward/mean/add': rewards[i]})
            (rows[-1] if rows else rows.append({}) or rows[-1])['val/acc'] = v
        return first_step(RewardWithoutValidation(validations=3), rows)
    step, (f, ) = run([0.5, 0.5, 0.45, 0.4, 0.35], [0, 0.2, 0.3, 0.4, 0.5])
    assert (step, f.alarm, f.domain) == (21, 'reward_without_val', 'all')  # 4th val after 0
    assert 'rose 0.300 -> 0.500' in f.message
    assert run([0.5, 0.5, 0.45, 0.4, 0.35], [0, 0.5, 0.5, 0.5, 0.5]) is None  # flat reward
    assert run([0.5, 0.5, 0.45, 0.46, 0.35], [0, 0.2, 0.3, 0.4, 0.5]) is None  # not monotone


def test_state_round_trip_continues_identically():
    rows = lengths([10.0] * 8 + [10 - i for i in range(1, 9)])
    whole = LengthCollapse(smooth=2)
    expected = [whole.observe(s, r) for s, r in enumerate(rows, 1)]
    first = LengthCollapse(smooth=2)
    for s, r in enumerate(rows[:9], 1):
        first.observe(s, r)
    resumed = LengthCollapse(smooth=2)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    assert [resumed.observe(s, r) for s, r in enumerate(rows[9:], 10)] == expected[9:]


def test_build_checks_rejects_unknown_names_and_arguments():
    assert 'clip' not in build_checks({'clip': None})
    with pytest.raises(ValueError, match='valid:'):
        build_checks({'lenght_collapse': {}})
    with pytest.raises(ValueError, match='length_collapse'):
        build_checks({'length_collapse': {'dorp': 0.3}})
    with pytest.raises(ValueError, match='drop must be in'):
        build_checks({'length_collapse': {'drop': 1.5}})


def test_an_absent_domain_keeps_its_alarm_and_a_found_one_is_raised_once():
    from gepo_xtuner.analysis.health import Finding, next_active
    f = Finding('length_collapse', 'add', '...')
    active, new = next_active(set(), [f, f], {'response/length/add': 1.0})
    assert active == {('length_collapse', 'add')} and new == [f]
    active, new = next_active(active, [], {'response/length/mul': 5.0})  # add not in batch
    assert active == {('length_collapse', 'add')} and new == []
    active, new = next_active(active, [f], {'response/length/add': 1.0})
    assert new == []  # held, not raised again
    active, new = next_active(active, [], {'response/length/add': 9.0})  # recovered
    assert active == set()
