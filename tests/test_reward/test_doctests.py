"""Runs the docstring examples of every reward module (each reward class has one)."""

import doctest
import importlib

import pytest

MODULES = ['answer', 'base', 'chart', 'choice', 'code', 'instruction', 'math',
           'math_check', 'numeric', 'numeric_check', 'sandbox.trainer', 'sandbox.trainer_tests',
           'worker']


@pytest.mark.parametrize('name', MODULES)
def test_docstring_examples(name):
    # the sandbox logs its containment level once per process, at the first CodeReward: have that
    # happen here so the examples' output does not depend on which tests ran before
    from gepo_xtuner.reward.code import CodeReward
    CodeReward(timeout_s=5)
    module = importlib.import_module(f'gepo_xtuner.reward.{name}')
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f'{name} has no docstring examples'
    assert result.failed == 0


def test_every_registered_reward_has_an_example_and_builds_with_defaults():
    from gepo_xtuner.registry import REWARDS
    expected = {'ChartQAReward', 'CodeReward', 'ExactMatchReward', 'InstructionFollowingReward',
                'MathReward', 'MultipleChoiceReward', 'NumericReward'}
    assert expected <= set(REWARDS.module_dict)
    for name, cls in REWARDS.module_dict.items():
        if not cls.__module__.startswith('gepo_xtuner.'):
            continue  # registered by a test's plugin module
        assert name == cls.__name__
        assert '>>>' in (cls.__doc__ or ''), f'{name} has no docstring example'
        assert callable(REWARDS.build({'type': name}))
