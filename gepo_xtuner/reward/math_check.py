"""Final-answer equivalence for math with the ``math-verify`` library (no timeout here).

Pure module: :class:`~gepo_xtuner.reward.math.MathReward` runs :func:`math_equal` inside
a :class:`~gepo_xtuner.reward.worker.VerifierWorker`, which owns the timeout.
"""

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

__all__ = ['math_equal', 'parse_reference']

# math-verify's own timeouts use SIGALRM; the worker process enforces the limit instead.
_NO_TIMEOUT = {'parsing_timeout': None}
_GOLD_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())
_PRED_CONFIG = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


def parse_reference(answer: str) -> list:
    """Parses a reference answer (plain, ``$..$``-wrapped or boxed LaTeX).

    Raises:
        ValueError: if math-verify extracts nothing from it (a data problem, reported
            so it is counted instead of silently scoring every completion 0).
    """
    text = str(answer).strip()
    if '\\boxed' not in text and '$' not in text:
        text = f'${text}$'
    gold = parse(text, extraction_config=_GOLD_CONFIG, **_NO_TIMEOUT)
    if not gold:
        raise ValueError(f'math-verify cannot parse the reference answer {answer!r}; fix '
                         "the record's 'answer' (LaTeX or a plain expression)")
    return gold


def math_equal(completion: str, answer: str, float_rounding: int = 6,
               strict: bool = True) -> bool:
    r"""Whether the completion's final answer equals ``answer`` mathematically.

    The prediction is the last ``\boxed{}`` if any, else the last LaTeX or plain
    expression math-verify finds. Equivalence covers numbers (``0.5`` = ``\frac12``),
    expressions (``\sqrt{12}`` = ``2\sqrt3``), sets, intervals, tuples and matrices.

    Args:
        completion: the model's full response.
        answer: the reference answer.
        float_rounding: decimals kept when a float is compared with an exact number.
        strict: math-verify's strict mode (variables must match by name; sets are not
            tuples).

    Example:
        >>> math_equal(r'... so the answer is $\boxed{\dfrac{1}{2}}$.', '0.5')
        True
        >>> math_equal(r'\boxed{(-\infty, 3]}', r'(-\infty, 3)')
        False
    """
    gold = parse_reference(answer)
    pred = parse(completion, extraction_config=_PRED_CONFIG, **_NO_TIMEOUT)
    if not pred:
        return False
    return bool(verify(gold, pred, float_rounding=float_rounding, strict=strict,
                       timeout_seconds=None))


# math-verify builds its regexes and parsers lazily (about 0.3 s): pay that at import,
# i.e. in the worker's start-up, not in the first check's time limit.
math_equal(r'\boxed{1}', '1')
