"""MultipleChoiceReward: option letters as GPQA, MMLU-Pro, MMMU-Pro and SFE answers are written."""

import pytest

from gepo_xtuner.reward import MultipleChoiceReward
from gepo_xtuner.reward.choice import extract_choice

GPQA = {
    'domain': 'science', 'data_source': 'gpqa_diamond', 'answer': 'C',
    'prompt': 'Two quantum states with energies E1 and E2 have lifetimes of 10^-9 s and '
              '10^-8 s. Which energy difference lets them be clearly resolved?',
    'choices': ['10^-11 eV', '10^-8 eV', '10^-4 eV', '10^-9 eV'],
}


@pytest.fixture
def reward():
    return MultipleChoiceReward()


@pytest.mark.parametrize('completion', [
    'The lifetime broadening is about 1e-7 eV, so only (C) exceeds it.\n\nAnswer: C',
    'Therefore, the correct answer is (C).',
    'The answer is C.',
    'the answer is c.',
    'Final answer: **C**',
    '**Answer:** (C)',
    r'... so the energy difference must be $\boxed{C}$.',
    r'$\boxed{\text{(C)}}$',
    'C',
    '(C) 10^-4 eV',
    'The correct option is C) 10^-4 eV',
    'Answer: 10^-4 eV',  # the option's text
    r'\boxed{10^-4 eV}',
    # an earlier mention of another option does not matter, the last statement does
    'Option B (10^-8 eV) is too small. Hence the answer is C',
    'Answer: B\nWait, B is below the linewidth. Answer: C',
])
def test_correct_answers_in_many_styles(reward, completion):
    assert reward(completion, GPQA) == 1.0


@pytest.mark.parametrize('completion', [
    'Answer: B',
    r'$\boxed{D}$',
    'The answer is A or C.',  # hedged
    r'\boxed{A, B, C, D}',  # every option
    'Answer: C, D',
    'Let us compare (A), (B), (C) and (D) carefully.',  # no commitment
    'The answer is a function of the lifetimes.',  # lowercase "a" is a word here
    'The answer is not obvious.',
    '',
    'Answer: E',  # only four options
])
def test_wrong_hedged_or_missing_answers(reward, completion):
    assert reward(completion, GPQA) == 0.0


def test_mmlu_pro_ten_options_and_answer_index(reward):
    record = {'answer': 9, 'choices': [f'option {i}' for i in range(10)],  # answer_index
              'data_source': 'mmlu_pro'}
    assert reward('Let\'s think step by step. ... The answer is (J)', record) == 1.0
    assert reward('The answer is (I)', record) == 0.0
    letter_record = {'answer': 'J'}  # no choices given: options A-J
    assert reward('answer: j', letter_record) == 1.0


def test_choices_as_a_mapping_and_answer_as_text(reward):
    record = {'answer': 'Mitochondria', 'choices': {'A': 'Nucleus', 'B': 'Mitochondria',
                                                     'C': 'Ribosome', 'D': 'Golgi apparatus'}}
    assert reward('The organelle shown is the mitochondria.\nAnswer: B', record) == 1.0
    assert reward('Answer: mitochondria', record) == 1.0
    assert MultipleChoiceReward(match_option_text=False)('Answer: mitochondria', record) == 0.0


def test_last_letter_fallback_is_opt_in():
    text = 'Comparing the options, (A) and (B) fail; the best is D'
    assert extract_choice(text) is None
    assert extract_choice(text, last_letter_fallback=True) == 'D'
    assert MultipleChoiceReward(last_letter_fallback=True)(text, {'answer': 'D'}) == 1.0


def test_invalid_reference_raises(reward):
    with pytest.raises(ValueError, match='not a letter in A-D'):
        reward('Answer: A', {'answer': 'Z', 'choices': ['1', '2', '3', '4']})
    with pytest.raises(ValueError, match='at most 10'):
        reward('Answer: A', {'answer': 'A', 'choices': [str(i) for i in range(11)]})
