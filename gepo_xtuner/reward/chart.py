"""ChartQAReward: ChartQA's relaxed accuracy (numbers within 5 %, text by exact match)."""

import re
from typing import Any

from ..registry import REWARDS
from .base import Reward
from .answer import final_answer, strip_latex_text

__all__ = ['ChartQAReward', 'relaxed_match']

_NUMBER = re.compile(r'[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?')
_CURRENCY = str.maketrans('', '', '$€£¥')


def _to_number(text: str) -> tuple[float, bool] | None:
    """``(value, had_percent_sign)`` if ``text`` is one number, else ``None``."""
    text = text.strip().translate(_CURRENCY).replace('−', '-').strip()
    percent = text.endswith('%')
    text = text.rstrip('%').strip()
    if not text or _NUMBER.fullmatch(text) is None or not any(ch.isdigit() for ch in text):
        return None
    return float(text.replace(',', '')), percent


def _normalise_text(text: str) -> str:
    return ' '.join(text.lower().strip().strip('"\'').rstrip('.').split())


def relaxed_match(prediction: str, target: Any, tolerance: float = 0.05) -> bool:
    """ChartQA's relaxed accuracy for one answer.

    Numbers (``1,234``, ``$5``, ``45%``) match if ``|pred - target| <= tolerance *
    |target|`` (a zero target needs exactly 0); a percent sign on either side also
    allows the value divided by 100, so ``45%`` matches both ``45`` and ``0.45``. Other
    answers match after lower-casing and trimming spaces, quotes and a final full stop.

    Example:
        >>> relaxed_match('1,020', '1000')
        True
        >>> relaxed_match('43%', '0.45')
        True
        >>> relaxed_match('1,100', '1000')
        False
        >>> relaxed_match('Yes.', 'yes')
        True
    """
    pred_num = _to_number(str(prediction))
    target_num = (float(target), False) if isinstance(target, (int, float)) \
        and not isinstance(target, bool) else _to_number(str(target))
    if pred_num is not None and target_num is not None:
        preds = {pred_num[0]} | ({pred_num[0] / 100} if pred_num[1] else set())
        targets = {target_num[0]} | ({target_num[0] / 100} if target_num[1] else set())
        return any(abs(p - t) <= tolerance * abs(t) for p in preds for t in targets)
    return _normalise_text(str(prediction)) == _normalise_text(str(target))


def _prediction(completion: str) -> str:
    stated = final_answer(completion)
    if stated is not None:
        return strip_latex_text(stated)
    lines = [line for line in completion.strip().splitlines() if line.strip()]
    return strip_latex_text(lines[-1]) if lines else ''


@REWARDS.register_module()
class ChartQAReward(Reward):
    r"""1.0 if the chart answer is right under ChartQA's relaxed accuracy, else 0.0.

    The prediction is the last ``\boxed{}``, else the last "answer: ..." line, else the
    last non-empty line of the completion; it is compared with the record's ``answer``
    by :func:`relaxed_match`. A list ``answer`` (ChartQAPro) needs as many
    comma/semicolon/newline-separated items, each matching in order.

    Args:
        tolerance: relative tolerance for numbers (default 0.05, ChartQA's 5 %).

    Example:
        >>> reward = ChartQAReward()
        >>> reward('The bars sum to 58.3, so the answer is 58.', {'answer': '57.9'})
        1.0
        >>> reward('Answer: 62', {'answer': '57.9'})
        0.0
        >>> reward('Answer: Brazil, 3,450', {'answer': ['Brazil', '3500']})
        1.0
    """

    required_fields = ('answer',)

    def __init__(self, tolerance: float = 0.05) -> None:
        if not 0 <= tolerance < 1:
            raise ValueError(f'tolerance must be in [0, 1), got {tolerance}')
        self.tolerance = float(tolerance)

    def __call__(self, completion: str, record: dict[str, Any]) -> float:
        target = record.get('answer')
        if target is None:
            raise ValueError(f"chart record {record.get('id', '?')!r} has no 'answer'")
        prediction = _prediction(completion)
        if isinstance(target, (list, tuple)):
            # Thousands separators are not item separators: "3,450" stays one item.
            protected = re.sub(r'(?<=\d),(?=\d{3}(?!\d))', '', prediction)
            items = [item for item in re.split(r'[,;\n]', protected) if item.strip()]
            return float(len(items) == len(target) and all(
                relaxed_match(p, t, self.tolerance) for p, t in zip(items, target)))
        return float(relaxed_match(prediction, target, self.tolerance))
