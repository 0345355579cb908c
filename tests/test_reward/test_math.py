"""MathReward: math-verify equivalence on MATH/AIME-style answers, with a hard timeout."""

import copy
import threading
import time

import pytest

from gepo_xtuner.registry import REWARDS
from gepo_xtuner.reward import MathReward, RewardRouter


@pytest.fixture(scope='module')
def reward():
    fn = MathReward(timeout_s=10)
    yield fn
    fn._check.close()


@pytest.mark.parametrize('completion, answer', [
    # MATH (Level 5 style): fractions written differently
    (r'Summing the two cases, the probability is $\boxed{\dfrac{14}{3}}$.', r'\frac{14}{3}'),
    (r'So $x = \boxed{0.5}$', r'\frac{1}{2}'),
    # radicals simplified differently
    (r'The side length is $\boxed{\sqrt{12}}$.', r'2\sqrt{3}'),
    # intervals (MATH "Intermediate Algebra")
    (r'Hence the domain is $\boxed{(-\infty, 3]}$.', r'(-\infty,3]'),
    # AIME answers are integers 000-999; leading zeros are not a different number
    (r'The remainder when divided by 1000 is $\boxed{070}$.', '70'),
    # polynomial identity, sets
    (r'$\boxed{(x+1)^2}$', 'x^2+2x+1'),
    (r'The solutions are $\boxed{\{2, -1\}}$', r'\{-1, 2\}'),
    # a plain final line without a box (math-verify finds the last expression)
    ('Therefore the answer is 336.', '336'),
])
def test_equivalent_answers_score_one(reward, completion, answer):
    assert reward(completion, {'answer': answer}) == 1.0


@pytest.mark.parametrize('completion, answer', [
    (r'The remainder is $\boxed{71}$.', '70'),  # AIME off by one
    (r'$\boxed{(-\infty, 3)}$', r'(-\infty,3]'),  # open vs closed end
    (r'$\boxed{\frac{3}{14}}$', r'\frac{14}{3}'),  # inverted fraction
    # hedging with two boxes is a set, not the answer
    (r'It is either $\boxed{3}$ or $\boxed{4}$.', '3'),
    ('I could not solve this problem.', '42'),  # no answer at all
])
def test_wrong_or_missing_answers_score_zero(reward, completion, answer):
    assert reward(completion, {'answer': answer}) == 0.0


GSM8K_ANSWER = ('Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = '
                '<<48+24=72>>72 clips altogether in April and May.\n#### 72')


@pytest.mark.parametrize('completion, score', [
    ('In May she sold 24, so 48 + 24 = 72 clips in all. #### 72', 1.0),
    (r'Altogether: $\boxed{72}$', 1.0),
    ('She sold 24 clips in May.', 0.0),  # the last number of the solution is not the answer
    ('#### 48', 0.0),
])
def test_gsm8k_answers_are_compared_by_the_number_after_the_marks(reward, completion, score):
    assert reward(completion, {'answer': GSM8K_ANSWER}) == score
    assert reward(r'\boxed{1000}', {'answer': 'Add them up.\n#### 1,000'}) == 1.0
    with pytest.raises(ValueError, match="nothing after '####'"):
        reward('72', {'answer': 'Worked solution. ####  '})


def test_missing_or_unparsable_reference_raises(reward):
    with pytest.raises(ValueError, match="has no 'answer'"):
        reward(r'\boxed{1}', {'id': 'q1'})
    with pytest.raises(Exception, match='cannot parse the reference'):
        reward(r'\boxed{1}', {'answer': '   '})


def test_a_runaway_check_is_cut_off_and_the_worker_restarts():
    """9^(9^9) has 370 million digits: sympy would compute it in C for minutes."""
    fn = MathReward(timeout_s=1)
    try:
        assert fn(r'$\boxed{1}$', {'answer': '1'}) == 1.0  # worker started before timing
        start = time.monotonic()
        with pytest.raises(TimeoutError, match='longer than 1 s'):
            fn(r'The answer is $\boxed{9^{9^{9}}}$', {'answer': '7'})
        assert time.monotonic() - start < 3
        assert fn(r'$\boxed{7}$', {'answer': '7'}) == 1.0  # a fresh worker
    finally:
        fn._check.close()


def test_router_counts_a_verifier_timeout_in_reward_errors():
    router = RewardRouter(dict(math=dict(type='MathReward', timeout_s=1),
                               default=dict(type='ExactMatchReward')))
    try:
        rewards, metrics = router(
            [r'$\boxed{9^{9^{9}}}$', r'$\boxed{\frac{1}{2}}$', 'yes'],
            [dict(domain='math', answer='1'), dict(domain='math', answer='0.5'),
             dict(domain='general', answer='yes')])
    finally:
        router.fns['math']._check.close()
    assert rewards.tolist() == [0.0, 1.0, 1.0]
    assert metrics == {'reward/errors/general': 0.0, 'reward/errors/math': 1.0}


def test_works_from_a_worker_thread_and_after_deepcopy(reward):
    """No SIGALRM: the timeout lives in the helper process, so threads are fine."""
    results = []
    thread = threading.Thread(
        target=lambda: results.append(reward(r'$\boxed{2\pi}$', {'answer': r'2\pi'})))
    thread.start()
    thread.join(30)
    assert results == [1.0]
    clone = copy.deepcopy(reward)  # config systems copy objects; the process is not copied
    try:
        assert clone(r'$\boxed{5}$', {'answer': 5}) == 1.0
    finally:
        clone._check.close()


def test_built_from_the_registry():
    fn = REWARDS.build(dict(type='MathReward', timeout_s=3, float_rounding=4))
    assert isinstance(fn, MathReward)
    assert fn._check.timeout_s == 3.0 and fn.float_rounding == 4
