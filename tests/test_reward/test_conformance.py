"""Every registered reward against the contract of ``Reward``.

The registry is read at test time: a reward added later must subclass ``Reward``,
build with its defaults and appear in ``EXAMPLES`` (one record it can score, with a
right and a wrong response), or this test fails and says so.
"""

import math

import pytest
import torch

from gepo_xtuner.registry import REWARDS, shipped
from gepo_xtuner.reward import RewardRouter
from gepo_xtuner.reward.base import Reward

NAMES = sorted(shipped(REWARDS))
EXAMPLES = {
    'ExactMatchReward': (dict(answer='42'), '42', '41'),
    'MathReward': (dict(answer='Natalia sold 48 + 24 = 72 clips.\n#### 72'), r'\boxed{72}',
                   r'\boxed{71}'),
    'NumericReward': (dict(answer='3.5', unit='km'), 'The answer is 3.5 km', 'It is 9 km'),
    'MultipleChoiceReward': (dict(answer='B', choices=['red', 'blue', 'green']), 'Answer: B',
                             'Answer: C'),
    'ChartQAReward': (dict(answer='12'), 'so the answer is 12.', 'Answer: 30'),
    'CodeReward': (dict(tests=[dict(input='2\n', output='4\n')]),
                   'print(int(input()) * 2)', 'print(0)'),
    'InstructionFollowingReward': (
        dict(instructions=[dict(id='punctuation:no_comma', kwargs={})]), 'no commas here',
        'one, two'),
}


def record(name: str, i: int = 0) -> dict:
    return dict(EXAMPLES[name][0], id=f'{name}-{i}', domain='d', prompt='p')


def test_every_registered_reward_has_an_example():
    assert set(NAMES) == set(EXAMPLES), 'add the new reward to EXAMPLES'


@pytest.mark.parametrize('name', NAMES)
def test_contract(name):
    reward = REWARDS.build(dict(type=name))
    assert isinstance(reward, Reward)
    _, right, wrong = EXAMPLES[name]
    rec = record(name)
    assert reward.check_record(rec) == []
    assert reward(right, rec) == 1.0 and reward(wrong, rec) == 0.0
    # the batch API agrees with the per-sample one, in order
    assert reward.score_batch([wrong, right, wrong], [rec] * 3) == [0.0, 1.0, 0.0]
    # a record without the reward's fields is refused by the reward, naming it
    bare = dict(id='bare', domain='d', prompt='p')
    problems = reward.check_record(bare)
    assert problems and name in problems[0]


class CountingBatchReward(Reward):
    """A reward with its own batched call (as a reward-model server would have)."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def __call__(self, completion, record):
        if completion == 'boom':
            raise RuntimeError('bad sample')
        return float(completion == record['answer'])

    def score_batch(self, completions, records):
        self.batches.append(len(completions))
        return [self(c, r) for c, r in zip(completions, records)]


def test_router_uses_the_batch_api_and_isolates_a_failing_sample():
    fn = CountingBatchReward()
    router = RewardRouter(dict(math=fn, default=dict(type='ExactMatchReward')))
    recs = [dict(domain='math', answer='1', id='a'), dict(domain='other', answer='2', id='b'),
            dict(domain='math', answer='3', id='c')]
    rewards, metrics = router(['1', '2', 'x'], recs)
    assert rewards.tolist() == [1.0, 1.0, 0.0] and fn.batches == [2]
    rewards, metrics = router(['boom', '2', '3'], recs)  # batch raises: per-sample fallback
    assert rewards.tolist() == [0.0, 1.0, 1.0]
    assert metrics['reward/errors/math'] == 1.0 and metrics['reward/errors/other'] == 0.0
    assert torch.isfinite(rewards).all() and not math.isnan(rewards.sum())


def test_router_refuses_records_their_reward_cannot_score():
    router = RewardRouter(dict(default=dict(type='MathReward')))
    with pytest.raises(ValueError, match=r"(?s)train: 1 record\(s\).*'r2': MathReward needs field"):
        router.check_records([dict(domain='math', answer='1', id='r1'),
                              dict(domain='math', id='r2')], 'train')
