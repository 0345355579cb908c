"""MathReward: final-answer equivalence for competition math (MATH, AIME, IMO-AnswerBench)."""

from typing import Any

from ..registry import REWARDS
from .base import Reward
from .worker import VerifierWorker

__all__ = ['MathReward', 'reference_answer']

#: GSM8K's separator between the worked solution and the final answer.
FINAL_ANSWER_MARK = '####'


def reference_answer(answer: Any) -> str:
    """The reference a record's ``answer`` states: the text after the last ``####``, if any.

    GSM8K publishes each answer as the worked solution followed by ``#### <number>``;
    only the number is the reference. Answers without ``####`` are used whole.

    Example:
        >>> reference_answer('Natalia sold 48/2 = <<48/2=24>>24 clips in May.\\n#### 72')
        '72'
        >>> reference_answer(70)
        '70'

    Raises:
        ValueError: nothing follows the last ``####``.
    """
    text = str(answer)
    if FINAL_ANSWER_MARK not in text:
        return text
    final = text.rsplit(FINAL_ANSWER_MARK, 1)[1].strip()
    if not final:
        raise ValueError(f'answer {text[-60:]!r} has nothing after {FINAL_ANSWER_MARK!r}: write '
                         f'the final answer after it, as GSM8K does ("... {FINAL_ANSWER_MARK} 72")')
    return final


@REWARDS.register_module()
class MathReward(Reward):
    r"""1.0 if the completion's final answer equals the record's ``answer``, else 0.0.

    Equivalence is decided by the `math-verify <https://github.com/huggingface/Math-Verify>`_
    library (:func:`~gepo_xtuner.reward.math_check.math_equal`): the prediction is the
    last ``\boxed{}`` (else the last expression found); LaTeX, fractions, radicals,
    percentages, sets, intervals and matrices compare by value, not by spelling.
    The reference is :func:`reference_answer` of the record's ``answer``: GSM8K's
    ``"<worked solution> #### 72"`` is compared as ``72``.

    The check runs in a persistent helper process (:class:`~.worker.VerifierWorker`), so
    an answer that makes sympy compute forever (``\boxed{9^{9^{9}}}``) is cut off.

    Args:
        timeout_s: wall-clock limit of one check (default 5). Exceeding it raises
            :class:`TimeoutError`, which :class:`~gepo_xtuner.reward.RewardRouter`
            counts in ``reward/errors/<domain>`` (reward 0).
        memory_mb: address-space limit of the helper process (default 4096).
        float_rounding: decimals kept when a float meets an exact number (default 6).
        strict: math-verify's strict mode (default True): variables match by name and a
            set is not a tuple.

    Raises (per call):
        ValueError: the record has no ``answer``, or math-verify cannot parse it.

    Example:
        >>> reward = MathReward()
        >>> reward(r'Adding the cases gives $\boxed{\frac{14}{3}}$.', {'answer': '14/3'})
        1.0
        >>> reward(r'The remainder is \boxed{70}.', {'answer': '071'})
        0.0
        >>> reward('She has 72 clips.', {'answer': 'Half of 48 is 24; 48 + 24 = 72.\\n#### 72'})
        1.0
    """

    required_fields = ('answer',)

    def __init__(self, timeout_s: float = 5.0, memory_mb: int | None = 4096,
                 float_rounding: int = 6, strict: bool = True) -> None:
        self.float_rounding = int(float_rounding)
        self.strict = bool(strict)
        self._check = VerifierWorker('gepo_xtuner.reward.math_check:math_equal',
                                     timeout_s=timeout_s, memory_mb=memory_mb)

    def __call__(self, completion: str, record: dict[str, Any]) -> float:
        if record.get('answer') is None:
            raise ValueError(f"math record {record.get('id', '?')!r} has no 'answer'")
        return float(self._check(completion, reference_answer(record['answer']),
                                 self.float_rounding, self.strict))

    def parse_record(self, record: dict[str, Any]) -> None:
        if not reference_answer(record['answer']).strip():
            raise ValueError("'answer' states no reference (empty, or nothing after '####')")
