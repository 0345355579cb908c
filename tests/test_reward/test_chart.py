"""ChartQAReward: ChartQA's relaxed accuracy on chart-style answers."""

import pytest

from gepo_xtuner.reward import ChartQAReward
from gepo_xtuner.reward.chart import relaxed_match


@pytest.fixture
def reward():
    return ChartQAReward()


@pytest.mark.parametrize('completion, answer', [
    ('58', '57.9'),  # within 5 %
    ('The gap between the two bars is 17.6, so the answer is 17.', '17.6'),
    ('Answer: 1,234', '1234'),  # thousands separator
    ('Answer: $1,180', '1234'),  # currency sign, 4.4 % off
    ('Answer: 45%', '45'),  # percent sign on the prediction
    ('Answer: 45%', '0.45'),  # ... or read as a fraction
    ('Answer: 0.45', '45%'),
    (r'The share of renewables is $\boxed{31.5}$', 31.5),
    ('Answer: -3.5', '-3.4'),
    ('0', '0'),
    ('Answer: Yes.', 'Yes'),
    ('Answer: United States', 'united states'),
    ('Looking at the legend...\nGermany', 'Germany'),  # last line
])
def test_relaxed_matches(reward, completion, answer):
    assert reward(completion, {'answer': answer}) == 1.0


@pytest.mark.parametrize('completion, answer', [
    ('Answer: 62', '57.9'),  # 7 % off
    ('Answer: 1,300', '1234'),  # 5.3 % off
    ('Answer: 0.001', '0'),  # zero needs exactly zero
    ('Answer: No', 'Yes'),
    ('Answer: United Kingdom', 'United States'),
    ('Answer: 12 million', '12'),  # not a bare number, not the same text
    ('', '5'),
])
def test_mismatches(reward, completion, answer):
    assert reward(completion, {'answer': answer}) == 0.0


def test_list_answers_match_item_by_item(reward):
    record = {'answer': ['Brazil', '3500']}
    assert reward('Answer: Brazil, 3,450', record) == 1.0
    assert reward('Answer: Brazil; 3500', record) == 1.0
    assert reward('Answer: Brazil', record) == 0.0  # missing item
    assert reward('Answer: 3500, Brazil', record) == 0.0  # wrong order


def test_tolerance_is_configurable():
    assert ChartQAReward(tolerance=0.0)('Answer: 58', {'answer': '57.9'}) == 0.0
    assert relaxed_match('104', '100', tolerance=0.05)
    assert not relaxed_match('106', '100', tolerance=0.05)
    with pytest.raises(ValueError, match='tolerance must be in'):
        ChartQAReward(tolerance=1.5)


def test_missing_answer_raises(reward):
    with pytest.raises(ValueError, match="has no 'answer'"):
        reward('Answer: 5', {'id': 'c1'})
