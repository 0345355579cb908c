"""InstructionFollowingReward and the IFEval checkers, with IFEval-style prompts."""

import pytest

from gepo_xtuner.reward import InstructionFollowingReward
from gepo_xtuner.reward.ifeval_checks import CHECKERS, check_instruction, split_sentences

ESSAY = ('The Industrial Revolution began in Britain. It changed how people worked. '
         'Factories replaced workshops. Cities grew quickly.')

# (id, kwargs, a response that follows it, one that does not)
CASES = [
    ('keywords:existence', {'keywords': ['engine', 'coal']},
     'The steam ENGINE ran on coal.', 'The steam engine ran on wood.'),
    ('keywords:frequency', {'keyword': 'river', 'frequency': 3, 'relation': 'at least'},
     'The river bends; the river floods; we love the river.', 'The river bends.'),
    ('keywords:frequency', {'keyword': 'very', 'frequency': 2, 'relation': 'less than'},
     'It was very cold.', 'It was very, very cold.'),
    ('keywords:forbidden_words', {'forbidden_words': ['sad', 'lonely']},
     'A cheerful song about summer.', 'A Lonely song about summer.'),
    ('keywords:letter_frequency', {'letter': 'z', 'let_frequency': 3, 'let_relation': 'at least'},
     'Zany zebras zigzag.', 'Zebras run.'),
    ('language:response_language', {'language': 'de'},
     'Die Industrielle Revolution begann in Großbritannien und veränderte die Arbeit.',
     'The Industrial Revolution began in Britain and changed how people worked.'),
    ('length_constraints:number_sentences', {'num_sentences': 4, 'relation': 'at least'},
     ESSAY, 'The Industrial Revolution began in Britain. It changed work.'),
    ('length_constraints:number_paragraphs', {'num_paragraphs': 3},
     'First part.\n***\nSecond part.\n***\nThird part.', 'First part.\n***\nSecond part.'),
    ('length_constraints:number_words', {'num_words': 10, 'relation': 'less than'},
     'Short answer here.', ESSAY),
    ('length_constraints:nth_paragraph_first_word',
     {'num_paragraphs': 2, 'nth_paragraph': 2, 'first_word': 'however'},
     'Cats are great.\n\n"However, dogs are loyal."', 'Cats are great.\n\nDogs are loyal.'),
    ('detectable_content:number_placeholders', {'num_placeholders': 2},
     'Dear [name], your order ships to [address].', 'Dear customer, it ships today.'),
    ('detectable_content:postscript', {'postscript_marker': 'P.S.'},
     'See you soon.\n\nP.S. Bring snacks.', 'See you soon. Bring snacks.'),
    ('detectable_content:postscript', {'postscript_marker': 'P.P.S'},
     'Bye.\nP.P.S I forgot.', 'Bye.\nP.S. I forgot.'),
    ('detectable_format:number_bullet_lists', {'num_bullets': 3},
     'Benefits:\n* cheap\n* fast\n- reliable', '* cheap\n* fast'),
    ('detectable_format:constrained_response', {},
     'My answer is yes.', 'Yes, definitely.'),
    ('detectable_format:number_highlighted_sections', {'num_highlights': 2},
     'This is *very important* and **also this**.', 'Only *one* here.'),
    ('detectable_format:multiple_sections', {'section_spliter': 'SECTION', 'num_sections': 2},
     'SECTION 1\nIntro.\nSECTION 2\nBody.', 'SECTION 1\nIntro only.'),
    ('detectable_format:json_format', {},
     '```json\n{"city": "Paris", "population": 2100000}\n```', '{"city": "Paris",}'),
    ('detectable_format:title', {},
     '<<Ode to the Sea>>\nWaves roll in.', 'Ode to the Sea\nWaves roll in.'),
    ('combination:two_responses', {},
     'Tea is calming.\n******\nCoffee is energising.', 'Tea is calming.\n******\nTea is calming.'),
    ('combination:repeat_prompt', {'prompt_to_repeat': 'Write a haiku about rain.'},
     'Write a haiku about rain. Soft drops on the roof...', 'Soft drops on the roof...'),
    ('startend:end_checker', {'end_phrase': 'Is there anything else I can help with?'},
     'Here it is. Is there anything else I can help with?', 'Here it is. Anything else?'),
    ('startend:quotation', {}, '"Wrapped in double quotes."', 'Not wrapped.'),
    ('change_case:capital_word_frequency', {'capital_frequency': 2, 'capital_relation': 'at least'},
     'This is VERY IMPORTANT news.', 'This is Very important news.'),
    ('change_case:english_capital', {},
     'THE MEETING IS MOVED TO FRIDAY AFTERNOON AT THREE.', 'The meeting is moved to Friday.'),
    ('change_case:english_lowercase', {},
     'the meeting is moved to friday afternoon at three.', 'The meeting is moved to friday.'),
    ('punctuation:no_comma', {}, 'No commas at all here.', 'Well, there is one.'),
]


@pytest.mark.parametrize('instruction_id, kwargs, good, bad', CASES,
                         ids=[f'{c[0]}-{i}' for i, c in enumerate(CASES)])
def test_each_checker_accepts_and_rejects(instruction_id, kwargs, good, bad):
    assert check_instruction(instruction_id, good, kwargs) is True
    assert check_instruction(instruction_id, bad, kwargs) is False


def test_every_ifeval_instruction_type_is_tested():
    assert {c[0] for c in CASES} == set(CHECKERS)
    assert len(CHECKERS) == 25


def test_ifeval_prompt_all_vs_fraction():
    """IFEval key 1000-like record: 300+ words... here scaled down, three constraints."""
    record = {
        'domain': 'instruction_following', 'data_source': 'ifeval',
        'prompt': 'Write a short blog post about a trip to Japan. Do not use any commas, '
                  'wrap your title in double angular brackets like <<title>> and write '
                  'fewer than 40 words.',
        'instructions': [
            {'id': 'punctuation:no_comma', 'kwargs': {}},
            {'id': 'detectable_format:title', 'kwargs': {}},
            {'id': 'length_constraints:number_words',
             'kwargs': {'num_words': 40, 'relation': 'less than'}},
        ]}
    follows_all = '<<Tokyo in Spring>>\nI landed in Tokyo and ate ramen at midnight. Kyoto was calm.'
    misses_one = '<<Tokyo in Spring>>\nI landed in Tokyo, ate ramen and saw Kyoto.'
    assert InstructionFollowingReward()(follows_all, record) == 1.0
    assert InstructionFollowingReward()(misses_one, record) == 0.0
    assert InstructionFollowingReward(mode='fraction')(misses_one, record) == pytest.approx(2 / 3)


def test_loose_mode_forgives_a_preamble_and_markdown():
    record = {'instructions': [{'id': 'startend:quotation', 'kwargs': {}}]}
    response = 'Sure! Here is my answer:\n"All of this is quoted."'
    assert InstructionFollowingReward()(response, record) == 0.0
    assert InstructionFollowingReward(loose=True)(response, record) == 1.0


def test_ifeval_dataset_columns_with_null_kwargs():
    """The HF IFEval rows fill unused arguments with null."""
    record = {'instruction_id_list': ['punctuation:no_comma', 'detectable_format:title'],
              'kwargs': [{'num_words': None, 'keywords': None},
                         {'num_words': None, 'keywords': None}]}
    assert InstructionFollowingReward()('<<Hi>> there', record) == 1.0


def test_unknown_ids_and_bad_arguments_raise_clear_errors():
    reward = InstructionFollowingReward()
    with pytest.raises(ValueError, match="unknown instruction id 'count:word_count_range'"):
        reward('text', {'instructions': [{'id': 'count:word_count_range', 'kwargs': {}}]})
    with pytest.raises(ValueError, match=r"takes arguments \['num_words', 'relation'\]"):
        reward('text', {'instructions': [{'id': 'length_constraints:number_words',
                                          'kwargs': {'num_word': 3}}]})
    with pytest.raises(ValueError, match="relation must be 'less than' or 'at least'"):
        check_instruction('length_constraints:number_words', 'x',
                          {'num_words': 3, 'relation': 'exactly'})
    with pytest.raises(ValueError, match="has no 'instructions'"):
        reward('text', {'id': 'r1'})
    with pytest.raises(ValueError, match="mode must be 'all' or 'fraction'"):
        InstructionFollowingReward(mode='mean')


def test_empty_response_fails_language_and_case_checks():
    assert not check_instruction('language:response_language', '', {'language': 'en'})
    assert not check_instruction('change_case:english_lowercase', '12345')


def test_sentence_splitter_handles_abbreviations_decimals_and_initials():
    text = ('Dr. Smith measured 3.5 m. J. K. Rowling wrote it, e.g. in 1997. '
            'Was it late? Yes! "Quoted start." Done')
    assert split_sentences(text) == [
        'Dr. Smith measured 3.5 m.', 'J. K. Rowling wrote it, e.g. in 1997.', 'Was it late?',
        'Yes!', '"Quoted start."', 'Done']
