"""RewardRouter: per-domain routing, failure isolation, counting."""

import math

import pytest
import torch

from gepo_xtuner.reward import ExactMatchReward, RewardRouter


def test_routes_by_domain_with_default():
    router = RewardRouter(dict(default=dict(type='ExactMatchReward'),
                               loud=lambda c, r: 2.0 * (c == r['answer'])))
    rewards, metrics = router(['4', '5', 'x'], [dict(domain='math', answer='4'),
                                                dict(domain='loud', answer='5'),
                                                dict(domain='math', answer='y')])
    assert rewards.tolist() == [1.0, 2.0, 0.0]
    assert metrics == {'reward/errors/loud': 0.0, 'reward/errors/math': 0.0}


def test_a_raising_or_nonfinite_reward_scores_zero_counts_and_warns(caplog):
    def flaky(completion, record):
        if record['id'] == 'bad':
            raise KeyError('tests')
        return math.nan if record['id'] == 'nan' else 1.0

    router = RewardRouter(dict(default=flaky))
    records = [dict(domain='code', id=i) for i in ('ok', 'bad', 'nan', 'bad')]
    with caplog.at_level('WARNING'):
        rewards, metrics = router(['a'] * 4, records)
    assert rewards.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert metrics['reward/errors/code'] == 3.0
    assert rewards.dtype == torch.float32


def test_missing_domain_without_default_is_a_config_error():
    router = RewardRouter(dict(math=ExactMatchReward()))
    with pytest.raises(ValueError, match="no reward function for domain 'code'"):
        router(['1'], [dict(domain='code', answer='1')])
