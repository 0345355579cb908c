"""NumericReward: numbers with tolerance and units, or symbolic expressions (physics, science)."""

from typing import Any

from ..registry import REWARDS
from .base import Reward
from .worker import VerifierWorker

__all__ = ['NumericReward']


@REWARDS.register_module()
class NumericReward(Reward):
    r"""1.0 if the completion's final answer equals the reference within tolerance, else 0.0.

    The prediction is the last ``\boxed{}``, else the last "answer: ..." line, else (with
    ``fallback_last_number``) the last number of the completion. It is read as a number
    with an optional unit or as an expression
    (:func:`~gepo_xtuner.reward.numeric_check.parse_answer`), then compared:

    * **quantities**: the prediction is converted to the reference's unit with `pint`
      (``3200 m`` = ``3.2 km``; ``25 °C`` = ``298.15 K``; a unit of another dimension is
      wrong) and accepted if ``|pred - ref| <= max(rel_tol * |ref|, abs_tol)``. The
      reference's unit comes from its text (``"3.2 km"``) or the record's ``unit``;
    * **expressions** (sympy): equal if they agree at 5 random points with every symbol
      in [0.5, 2.5], symbols matched by name (``v_{0}`` = ``v_0``).

    The check runs in a helper process with a hard timeout (:class:`~.worker.VerifierWorker`).

    Args:
        rel_tol: relative tolerance (default 1e-2, i.e. 1 %).
        abs_tol: absolute tolerance in the reference's unit (default 0: a fixed
            absolute tolerance would accept anything for answers like 1.6e-19 C).
        require_unit: if True, a bare number is wrong when the reference has a unit;
            if False (default) it is read in the reference's unit.
        fallback_last_number: use the last number when no final answer is stated
            (default True).
        timeout_s: wall-clock limit of one check (default 5); exceeding it raises
            :class:`TimeoutError` (counted in ``reward/errors/<domain>``).
        memory_mb: address-space limit of the helper process (default 4096).

    Raises (per call):
        ValueError: no ``answer`` in the record, or it cannot be read.

    Example:
        >>> reward = NumericReward()
        >>> record = {'answer': '3.2 km'}
        >>> reward(r'The car travels $\boxed{3200\ \mathrm{m}}$.', record)
        1.0
        >>> reward(r'The car travels $\boxed{3200\ \mathrm{s}}$.', record)
        0.0
        >>> reward('Answer: 9.79', {'answer': 9.81, 'unit': 'm/s^2'})
        1.0
    """

    required_fields = ('answer',)

    def __init__(self, rel_tol: float = 1e-2, abs_tol: float = 0.0, require_unit: bool = False,
                 fallback_last_number: bool = True, timeout_s: float = 5.0,
                 memory_mb: int | None = 4096) -> None:
        if rel_tol < 0 or abs_tol < 0:
            raise ValueError(f'rel_tol and abs_tol must be >= 0, got {rel_tol}, {abs_tol}')
        self.rel_tol = float(rel_tol)
        self.abs_tol = float(abs_tol)
        self.require_unit = bool(require_unit)
        self.fallback_last_number = bool(fallback_last_number)
        self._check = VerifierWorker('gepo_xtuner.reward.numeric_check:numeric_equal',
                                     timeout_s=timeout_s, memory_mb=memory_mb)

    def __call__(self, completion: str, record: dict[str, Any]) -> float:
        answer = record.get('answer')
        if answer is None:
            raise ValueError(f"numeric record {record.get('id', '?')!r} has no 'answer'")
        if not isinstance(answer, (int, float)) or isinstance(answer, bool):
            answer = str(answer)
        return float(self._check(completion, answer, record.get('unit'), self.rel_tol,
                                 self.abs_tol, self.require_unit, self.fallback_last_number))
