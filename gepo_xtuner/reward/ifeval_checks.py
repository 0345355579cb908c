"""Checkers for the 25 verifiable instruction types of IFEval (Zhou et al., 2023).

Each checker is ``fn(response, **kwargs) -> bool`` with IFEval's argument names, kept
in :data:`CHECKERS` under IFEval's instruction ids (e.g. ``'punctuation:no_comma'``).
The semantics follow the IFEval paper (https://arxiv.org/abs/2311.07911) and its
public definitions; the code is written for this project. Differences:

* sentences are split by a rule-based splitter (:func:`split_sentences`: ``.!?``
  followed by space and an upper-case letter, digit or quote, abbreviations and
  initials excepted) instead of NLTK's punkt model, whose data cannot be installed
  from PyPI; counts can differ by one on unusual text;
* words are ``\\w+`` runs (IFEval's own word counter does the same; its capital-word
  count uses NLTK's tokenizer);
* language detection uses ``langdetect`` like IFEval, but a response whose language
  cannot be detected (empty, digits only) fails instead of passing.

IFBench's out-of-distribution constraints are not implemented; an unknown id raises.
"""

import json
import re
from collections.abc import Callable

__all__ = ['CHECKERS', 'check_instruction', 'split_sentences']

_ABBREVIATIONS = frozenset({
    'mr', 'mrs', 'ms', 'dr', 'prof', 'sr', 'jr', 'st', 'vs', 'etc', 'e.g', 'i.e', 'inc', 'ltd',
    'co', 'fig', 'no', 'approx', 'u.s', 'u.k', 'a.m', 'p.m', 'dept', 'est', 'gen', 'gov',
    'mt', 'ave', 'vol', 'eq', 'cf', 'al'})
_BOUNDARY = re.compile(r'[.!?]+["\'”’)\]]*(?=\s|$)')
_WORD = re.compile(r'\w+')


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (non-empty, stripped).

    Example:
        >>> split_sentences('Dr. Smith arrived at 5 p.m. today. He left! Did he? Yes.')
        ['Dr. Smith arrived at 5 p.m. today.', 'He left!', 'Did he?', 'Yes.']
    """
    sentences, start = [], 0
    for match in _BOUNDARY.finditer(text):
        end = match.end()
        rest = text[end:].lstrip()
        if rest and not (rest[0].isupper() or rest[0].isdigit() or rest[0] in '"\'“‘([*-#'):
            continue  # "e.g. this", "3.5 m": no new sentence starts here
        if match.group(0) == '.':
            # Only the word before the dot: a scan from ``start`` would be quadratic.
            word_start = max(start, *(text.rfind(c, start, match.start()) + 1 for c in ' \t\n'))
            last = text[word_start:match.start()].lstrip('("\'')
            if last.lower() in _ABBREVIATIONS or (len(last) == 1 and last.isupper()):
                continue  # "Dr. Smith", "J. K. Rowling"
        sentences.append(text[start:end].strip())
        start = end
    sentences.append(text[start:].strip())
    return [s for s in sentences if s]


def _compare(count: int, relation: str, target: int) -> bool:
    if relation == 'less than':
        return count < target
    if relation == 'at least':
        return count >= target
    raise ValueError(f"relation must be 'less than' or 'at least', got {relation!r}")


def _language(text: str) -> str | None:
    from langdetect import DetectorFactory, LangDetectException, detect
    DetectorFactory.seed = 0  # langdetect is random otherwise
    try:
        return detect(text).split('-')[0]
    except LangDetectException:
        return None


def keywords_existence(response: str, keywords: list[str]) -> bool:
    return all(re.search(re.escape(k), response, re.IGNORECASE) for k in keywords)


def keywords_frequency(response: str, keyword: str, frequency: int, relation: str) -> bool:
    count = len(re.findall(re.escape(keyword), response, re.IGNORECASE))
    return _compare(count, relation, frequency)


def keywords_forbidden_words(response: str, forbidden_words: list[str]) -> bool:
    return not any(re.search(r'\b' + re.escape(w) + r'\b', response, re.IGNORECASE)
                   for w in forbidden_words)


def keywords_letter_frequency(response: str, letter: str, let_frequency: int,
                              let_relation: str) -> bool:
    return _compare(response.lower().count(letter.lower()), let_relation, let_frequency)


def language_response_language(response: str, language: str) -> bool:
    return _language(response) == language.split('-')[0]


def number_sentences(response: str, num_sentences: int, relation: str) -> bool:
    return _compare(len(split_sentences(response)), relation, num_sentences)


def number_paragraphs(response: str, num_paragraphs: int) -> bool:
    """Paragraphs separated by the markdown divider ``***``; no empty one in between."""
    parts = re.split(r'\s?\*\*\*\s?', response)
    count = len(parts)
    for i, part in enumerate(parts):
        if not part.strip():
            if 0 < i < len(parts) - 1:
                return False
            count -= 1
    return count == num_paragraphs


def number_words(response: str, num_words: int, relation: str) -> bool:
    return _compare(len(_WORD.findall(response)), relation, num_words)


def nth_paragraph_first_word(response: str, num_paragraphs: int, nth_paragraph: int,
                             first_word: str) -> bool:
    """Paragraphs separated by blank lines; the nth (1-based) starts with ``first_word``."""
    paragraphs = [p for p in re.split(r'\n[ \t]*\n', response) if p.strip()]
    if len(paragraphs) != num_paragraphs or not 1 <= nth_paragraph <= len(paragraphs):
        return False
    word = paragraphs[nth_paragraph - 1].split()[0]
    word = re.sub(r'^[^\w]+|[^\w]+$', '', word).lower()
    return word == first_word.strip().lower()


def number_placeholders(response: str, num_placeholders: int) -> bool:
    return len(re.findall(r'\[[^\]\n]*\]', response)) >= num_placeholders


def postscript(response: str, postscript_marker: str) -> bool:
    marker = postscript_marker.strip().lower()
    if marker == 'p.p.s':
        pattern = r'p\.\s?p\.\s?s'
    elif marker == 'p.s.':
        pattern = r'p\.\s?s\.'
    else:
        pattern = re.escape(marker)
    return re.search(pattern, response.lower()) is not None


def number_bullet_lists(response: str, num_bullets: int) -> bool:
    # [ \t]* rather than IFEval's \s*: same lines, without quadratic scans of blank lines
    stars = re.findall(r'^[ \t]*\*[^*\n].*$', response, re.MULTILINE)
    dashes = re.findall(r'^[ \t]*-.*$', response, re.MULTILINE)
    return len(stars) + len(dashes) == num_bullets


def constrained_response(response: str) -> bool:
    return any(option in response.strip() for option in
               ('My answer is yes.', 'My answer is no.', 'My answer is maybe.'))


def number_highlighted_sections(response: str, num_highlights: int) -> bool:
    single = [h for h in re.findall(r'\*[^\n*]*\*', response) if h.strip('*').strip()]
    double = [h for h in re.findall(r'\*\*[^\n*]*\*\*', response) if h.strip('*').strip()]
    return len(single) + len(double) >= num_highlights


def multiple_sections(response: str, section_spliter: str, num_sections: int) -> bool:
    sections = re.split(r'\s?' + re.escape(section_spliter.strip()) + r'\s?\d+\s?', response)
    return len(sections) - 1 >= num_sections


def json_format(response: str) -> bool:
    text = response.strip()
    if text.startswith('```'):  # a fenced block: drop the fences and the language tag
        text = text[3:]
        text = text[4:] if text[:4].lower() == 'json' else text
        text = text.removesuffix('```')
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def title(response: str) -> bool:
    return any(t.strip('<>').strip() for t in re.findall(r'<<[^\n<>]+>>', response))


def two_responses(response: str) -> bool:
    parts = response.split('******')
    valid = []
    for i, part in enumerate(parts):
        if not part.strip():
            if 0 < i < len(parts) - 1:
                return False
        else:
            valid.append(part.strip())
    return len(valid) == 2 and valid[0] != valid[1]


def repeat_prompt(response: str, prompt_to_repeat: str) -> bool:
    return response.strip().lower().startswith(prompt_to_repeat.strip().lower())


def end_checker(response: str, end_phrase: str) -> bool:
    return response.strip().strip('"').lower().endswith(end_phrase.strip().lower())


def quotation(response: str) -> bool:
    text = response.strip()
    return len(text) > 1 and text[0] == '"' and text[-1] == '"'


def capital_word_frequency(response: str, capital_frequency: int, capital_relation: str
                           ) -> bool:
    count = sum(1 for w in _WORD.findall(response) if w.isupper())
    return _compare(count, capital_relation, capital_frequency)


def english_capital(response: str) -> bool:
    return response.isupper() and _language(response) == 'en'


def english_lowercase(response: str) -> bool:
    return response.islower() and _language(response) == 'en'


def no_comma(response: str) -> bool:
    return ',' not in response


#: IFEval instruction id -> checker.
CHECKERS: dict[str, Callable[..., bool]] = {
    'keywords:existence': keywords_existence,
    'keywords:frequency': keywords_frequency,
    'keywords:forbidden_words': keywords_forbidden_words,
    'keywords:letter_frequency': keywords_letter_frequency,
    'language:response_language': language_response_language,
    'length_constraints:number_sentences': number_sentences,
    'length_constraints:number_paragraphs': number_paragraphs,
    'length_constraints:number_words': number_words,
    'length_constraints:nth_paragraph_first_word': nth_paragraph_first_word,
    'detectable_content:number_placeholders': number_placeholders,
    'detectable_content:postscript': postscript,
    'detectable_format:number_bullet_lists': number_bullet_lists,
    'detectable_format:constrained_response': constrained_response,
    'detectable_format:number_highlighted_sections': number_highlighted_sections,
    'detectable_format:multiple_sections': multiple_sections,
    'detectable_format:json_format': json_format,
    'detectable_format:title': title,
    'combination:two_responses': two_responses,
    'combination:repeat_prompt': repeat_prompt,
    'startend:end_checker': end_checker,
    'startend:quotation': quotation,
    'change_case:capital_word_frequency': capital_word_frequency,
    'change_case:english_capital': english_capital,
    'change_case:english_lowercase': english_lowercase,
    'punctuation:no_comma': no_comma,
}


def check_instruction(instruction_id: str, response: str, kwargs: dict | None = None) -> bool:
    """Whether ``response`` follows one instruction.

    Args:
        instruction_id: an IFEval id, e.g. ``'length_constraints:number_words'``.
        response: the model's response.
        kwargs: the instruction's arguments (IFEval names); ``None`` values are dropped,
            as the IFEval dataset fills unused arguments with null.

    Raises:
        ValueError: unknown id, or missing/unexpected arguments (the message lists the
            expected ones).

    Example:
        >>> check_instruction('length_constraints:number_words', 'Two words.',
        ...                   {'num_words': 5, 'relation': 'less than'})
        True
        >>> check_instruction('punctuation:no_comma', 'Yes, indeed.')
        False
    """
    checker = CHECKERS.get(instruction_id)
    if checker is None:
        raise ValueError(f'unknown instruction id {instruction_id!r}; supported (IFEval): '
                         f'{sorted(CHECKERS)}')
    args = {k: v for k, v in (kwargs or {}).items() if v is not None}
    expected = checker.__code__.co_varnames[1:checker.__code__.co_argcount]
    if set(args) != set(expected):
        raise ValueError(f'instruction {instruction_id!r} takes arguments {list(expected)}, '
                         f'got {sorted(args)}')
    return bool(checker(response, **args))
