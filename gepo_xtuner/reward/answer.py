"""Final-answer extraction from free-form completions, shared by the verifiers.

Standard library only: the isolated verifier worker (:mod:`.worker`) imports this
module without importing the rest of the package.

Every pattern here runs in linear time on adversarial input (no nested quantifiers),
because completions come from a policy under optimisation.
"""

import re

__all__ = ['final_answer', 'last_boxed', 'last_number', 'strip_latex_text']

_BOXED = re.compile(r'\\(?:boxed|fbox)\s*')
# "Answer: X", "The final answer is X", "**Answer:** X"; the span runs to the end of the line.
_ANSWER_LINE = re.compile(r'(?:final\s+answer|answer)[\s*]*(?:is|:|=|：)[\s*:]*([^\n]*)',
                          re.IGNORECASE)
# Mantissa (thousands separators allowed), optional exponent in e-notation or "x 10^{k}".
_NUMBER = re.compile(r'[-+−]?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)'
                     r'(?:[eE][-+]?\d+|\s*(?:\\times|\\cdot|×|\*)\s*10\s*\^\s*\{?\s*[-+−]?\d+\s*\}?)?')
_TEXT_MACRO = re.compile(r'\\(?:text|textbf|mathrm|mathbf|textrm|rm|operatorname)\s*\{([^{}]*)\}')


def last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` (or ``\fbox{...}``) with balanced braces.

    ``\boxed 5`` (no braces) gives the next whitespace-free token. ``None`` if there is
    no box or its braces never close.

    Example:
        >>> last_boxed(r'so $x=\boxed{\frac{1}{2}}$ and \boxed{3}')
        '3'
        >>> last_boxed(r'\boxed{\{1, 2\}}')
        '\\{1, 2\\}'
        >>> last_boxed('no box') is None
        True
    """
    starts = [m.end() for m in _BOXED.finditer(text)]
    # Only the last few boxes: each failed (unbalanced) try scans to the end of the text.
    for start in reversed(starts[-3:]):
        if start < len(text) and text[start] == '{':
            depth = 0
            for i in range(start, len(text)):
                ch = text[i]
                if ch == '\\':  # skip escaped braces such as \{
                    continue
                if ch == '{' and text[i - 1] != '\\':
                    depth += 1
                elif ch == '}' and text[i - 1] != '\\':
                    depth -= 1
                    if depth == 0:
                        return text[start + 1:i].strip()
            continue  # unbalanced: try an earlier box
        token = text[start:].split(maxsplit=1)
        if token:
            return token[0].rstrip('$.').strip()
    return None


def final_answer(text: str) -> str | None:
    r"""The final answer a completion states: last box, else last "answer is/:" line.

    The "answer" span is the rest of its line without surrounding markdown emphasis,
    ``$`` and a trailing full stop. ``None`` if the completion states neither.

    Example:
        >>> final_answer('Reasoning... The final answer is: **3.2 km**.')
        '3.2 km'
        >>> final_answer(r'Answer: $\boxed{42}$')
        '42'
        >>> final_answer('I think it is 7') is None
        True
    """
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    spans = [m.group(1) for m in _ANSWER_LINE.finditer(text)]
    for span in reversed(spans):
        while (inner := _ANSWER_LINE.search(span)) is not None:  # "Answer: the answer is 5"
            span = inner.group(1)
        previous = None
        while span != previous:  # peel "**$x$**." layer by layer
            previous = span
            span = span.strip(' \t*_$')
            span = span.removesuffix('.')
        if span:
            return span
    return None


def last_number(text: str) -> str | None:
    r"""The last number written in ``text`` (sign, thousands separators, decimals, exponent).

    Example:
        >>> last_number('from 1,200 to 3,456.5 units, i.e. 2.1e-3 per unit')
        '2.1e-3'
        >>> last_number(r'so q = 1.6 \times 10^{-19} C')
        '1.6 \\times 10^{-19}'
        >>> last_number('no digits') is None
        True
    """
    found = None
    for found in _NUMBER.finditer(text):
        pass
    return None if found is None else found.group(0)


def strip_latex_text(text: str) -> str:
    r"""Unwraps ``\text{..}``-style macros; drops ``$``, ``\(``, ``\left``, ``\,`` and the like.

    Example:
        >>> strip_latex_text(r'$3.2\,\text{km}$')
        '3.2 km'
    """
    for _ in range(3):  # nested \text{\textbf{..}}
        text = _TEXT_MACRO.sub(r' \1', text)
    for token, repl in (('\\left', ''), ('\\right', ''), ('\\,', ' '), ('\\;', ' '), ('\\!', ''),
                        ('\\ ', ' '), ('~', ' '), ('$', ''), ('\\(', ''), ('\\)', ''),
                        ('\\[', ''), ('\\]', '')):
        text = text.replace(token, repl)
    return ' '.join(text.split())
