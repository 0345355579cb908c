"""MultipleChoiceReward: option-letter extraction for GPQA, MMLU-Pro, MMMU-Pro, SFE, MicroVQA."""

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..registry import REWARDS
from .base import Reward
from .answer import last_boxed, strip_latex_text

__all__ = ['MultipleChoiceReward', 'extract_choice']

LETTERS = 'ABCDEFGHIJ'
# "answer is", "Answer:", "final answer:", "correct option is", "best choice:".
_MARKER = re.compile(r'(?:answer|correct\s+(?:option|choice)|best\s+(?:option|choice))'
                     r'[\s*]*(?:is|:|=|would\s+be|should\s+be|：)?[\s*:]*', re.IGNORECASE)
_UPPER_LEAD = re.compile(r'\(?([A-J])\)?(?=[\s.:),;]|$)')
_LOWER_LEAD = re.compile(r'\(([a-j])\)|([a-j])\)?[.,;!]?$')
_HEDGE = re.compile(r'\s*(?:,|/|&|\bor\b|\band\b)\s*\(?([A-Ja-j])\)?(?![A-Za-z])')
_LAST_LETTER = re.compile(r'(?<![A-Za-z])\(?([A-J])\)?(?![A-Za-z])')


def _clean(text: str) -> str:
    text, previous = strip_latex_text(text), None
    while text != previous:  # peel "**c**." layer by layer
        previous = text
        text = text.strip().strip('*_"\'` ')
        text = text.removesuffix('.')
    return text


def _norm_option(text: str) -> str:
    return ' '.join(_clean(text).lower().rstrip('.').split())


def _letter_from_span(span: str, letters: str, options: dict[str, str]
                      ) -> tuple[str | None, bool]:
    """``(letter, ambiguous)`` read from the start of an answer span."""
    span = _clean(span)
    match = _UPPER_LEAD.match(span)
    lower = _LOWER_LEAD.match(span) if match is None else None
    if match is not None or lower is not None:
        letter = (match.group(1) if match is not None else
                  (lower.group(1) or lower.group(2)).upper())
        end = match.end() if match is not None else lower.end()
        if letter in letters:
            hedge = _HEDGE.match(span, end)
            return letter, hedge is not None and hedge.group(1).upper() != letter
    wanted = _norm_option(span)
    for letter, option in options.items():
        if wanted and wanted == _norm_option(option):
            return letter, False
    return None, False


def extract_choice(text: str, n_options: int = 10, choices: Sequence[str] | None = None,
                   last_letter_fallback: bool = False) -> str | None:
    r"""The option letter a completion commits to, or ``None``.

    Rules, first that applies:

    1. the last ``\boxed{}``: ``\boxed{C}``, ``\boxed{\text{(C)}}`` or an option's text;
    2. the last answer statement whose span starts with a letter or is an option's
       text: ``Answer: C``, ``the answer is (C)``, ``Final answer: **c**.``,
       ``The correct option is C) 42 m/s``;
    3. a short first line that is a letter: ``C``, ``(C)``, ``C. 42 m/s``;
    4. with ``last_letter_fallback``, the last standalone capital letter (MMLU-Pro's
       last resort; off by default because reasoning mentions every option).

    A hedged answer (``Answer: A or C``, ``\boxed{A, B}``) counts as no answer.
    Lowercase letters count only as the whole span or in parentheses, so "the answer
    is a function" is not option A.

    Args:
        text: the completion.
        n_options: options are the first ``n_options`` of A-J.
        choices: option texts in letter order, to accept an answer given as text.
        last_letter_fallback: enable rule 4.

    Example:
        >>> extract_choice('Both B and D fail the test, so the answer is (C).')
        'C'
        >>> extract_choice(r'... $\boxed{\text{B}}$')
        'B'
        >>> extract_choice('the answer is c.')
        'C'
        >>> extract_choice('Answer: A or C') is None
        True
        >>> extract_choice('Answer: 42 m/s', choices=['21 m/s', '42 m/s'])
        'B'
    """
    if not 1 <= n_options <= len(LETTERS):
        raise ValueError(f'n_options must be in 1..{len(LETTERS)}, got {n_options}')
    letters = LETTERS[:n_options]
    options = {LETTERS[i]: str(c) for i, c in enumerate(choices or [])}
    boxed = last_boxed(text)
    if boxed is not None:
        letter, ambiguous = _letter_from_span(boxed, letters, options)
        if letter is not None:
            return None if ambiguous else letter
    for marker in reversed(list(_MARKER.finditer(text))):
        line_end = text.find('\n', marker.end())
        span = text[marker.end():line_end if line_end >= 0 else len(text)]
        letter, ambiguous = _letter_from_span(span, letters, options)
        if letter is not None:
            return None if ambiguous else letter
    first_line = next((line for line in text.splitlines() if line.strip()), '')
    if len(first_line) <= 40 or len(text.strip()) <= 40:
        letter, ambiguous = _letter_from_span(first_line, letters, options)
        if letter is not None:
            return None if ambiguous else letter
    if last_letter_fallback:
        found = [m.group(1) for m in _LAST_LETTER.finditer(text) if m.group(1) in letters]
        if found:
            return found[-1]
    return None


def reference_letter(record: dict[str, Any], n_options: int) -> str:
    """The correct letter of a record: a letter, a 0-based index, or an option's text."""
    answer = record.get('answer')
    choices = _choices(record)
    if isinstance(answer, int) and not isinstance(answer, bool):
        if 0 <= answer < n_options:
            return LETTERS[answer]
    elif answer is not None:
        text = _clean(str(answer)).strip('().: ')
        if len(text) == 1 and text.upper() in LETTERS[:n_options]:
            return text.upper()
        for i, option in enumerate(choices):
            if _norm_option(str(answer)) == _norm_option(option):
                return LETTERS[i]
    raise ValueError(f'multiple-choice record {record.get("id", "?")!r}: answer {answer!r} is '
                     f'not a letter in A-{LETTERS[n_options - 1]}, a 0-based index or the text '
                     'of one of its choices')


def _choices(record: dict[str, Any]) -> list[str]:
    choices = record.get('choices') or []
    if isinstance(choices, Mapping):  # {"A": "...", "B": "..."}
        return [str(choices[k]) for k in sorted(choices)]
    return [str(c) for c in choices]


@REWARDS.register_module()
class MultipleChoiceReward(Reward):
    r"""1.0 if the completion commits to the correct option, else 0.0.

    The letter is read by :func:`extract_choice`; the reference by the record's
    ``answer``: a letter (``"C"``, ``"(c)"``), a 0-based index (MMLU-Pro's
    ``answer_index``) or the text of one of ``choices``. With ``choices`` (a list in
    letter order, or ``{"A": ..., ...}``) the options are A.. up to their count and an
    answer stated as an option's text also counts; without, options are A-J.

    Args:
        match_option_text: accept an answer written as the option's text (default True).
        last_letter_fallback: if no answer statement is found, take the last
            standalone capital letter (default False; MMLU-Pro's evaluation does this,
            but in RL it rewards rambling that ends on the right letter).

    Raises (per call):
        ValueError: the record's answer is not a valid option.

    Example:
        >>> reward = MultipleChoiceReward()
        >>> gpqa = {'answer': 'C', 'choices': ['10^-4 eV', '10^-11 eV', '10^-8 eV', '10^-9 eV']}
        >>> reward('Comparing the lifetimes, the answer is (C).', gpqa)
        1.0
        >>> reward('Answer: D', gpqa)
        0.0
        >>> reward('Answer: 10^-8 eV', gpqa)
        1.0
    """

    required_fields = ('answer',)

    def __init__(self, match_option_text: bool = True, last_letter_fallback: bool = False
                 ) -> None:
        self.match_option_text = bool(match_option_text)
        self.last_letter_fallback = bool(last_letter_fallback)

    def __call__(self, completion: str, record: dict[str, Any]) -> float:
        choices = _choices(record)
        if len(choices) > len(LETTERS):
            raise ValueError(f'record {record.get("id", "?")!r} has {len(choices)} choices; '
                             f'at most {len(LETTERS)} (A-J) are supported')
        n_options = len(choices) or len(LETTERS)
        correct = reference_letter(record, n_options)
        got = extract_choice(completion, n_options,
                             choices if self.match_option_text else None,
                             self.last_letter_fallback)
        return float(got == correct)

    def parse_record(self, record: dict[str, Any]) -> None:
        choices = _choices(record)
        if len(choices) > len(LETTERS):
            raise ValueError(f'{len(choices)} choices; at most {len(LETTERS)} (A-J) are supported')
        reference_letter(record, len(choices) or len(LETTERS))
