"""Numeric and symbolic answer comparison with units (pint) and expressions (sympy).

Pure module: :class:`~gepo_xtuner.reward.numeric.NumericReward` runs
:func:`numeric_equal` inside a :class:`~gepo_xtuner.reward.worker.VerifierWorker`,
which owns the timeout.

An answer text is read as one of:

* a **quantity**: a number (``3200``, ``3,200``, ``-1.6e-19``, ``1.6\\times10^{-19}``)
  optionally followed by a unit pint understands (``km``, ``m/s^2``, ``\\mathrm{eV}``,
  ``^\\circ C``, ``\\%``, ``\\Omega``);
* an **expression**: LaTeX (parsed by ``latex2sympy2_extended``) or plain math
  (``sqrt(2*g*h)``, parsed by sympy from a whitelist of characters and functions, so no
  arbitrary Python is evaluated). Expressions without symbols become numbers.

A leading ``x =`` or ``\\approx`` is dropped: the value is what follows the last one.
"""

import functools
import math
import random
import re
from dataclasses import dataclass
from typing import Any

import pint
import sympy
from latex2sympy2_extended.latex2sympy2 import ConversionConfig, latex2sympy
from sympy.parsing.sympy_parser import (
    convert_xor,
    implicit_multiplication,
    parse_expr,
    standard_transformations,
)

from .answer import _NUMBER, final_answer, strip_latex_text

__all__ = ['Parsed', 'numeric_equal', 'parse_answer']

_NUMBER_PREFIX = re.compile(
    r'\s*([-+]?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d*)?|\.\d+))'
    r'(?:\s*(?:[eE]|\*\s*10\s*\*\*|\*?\s*10\s*\^)\s*\(?\s*([-+]?\d+)\s*\)?)?')
_SCI_LATEX = re.compile(r'\s*(?:\\times|\\cdot|×|x|\*)\s*10\s*\^\s*\{\s*([-+]?\d+)\s*\}')
_SCI_PLAIN = re.compile(r'\s*(?:\\times|\\cdot|×|x)\s*10\s*\^\s*([-+]?\d+)')
_DEGREE_SCALE = re.compile(r'°\s*([CF])\b')
_UNIT_START = re.compile(r'[A-Za-zµμΩÅ%°]')
_PLAIN_MATH_OK = re.compile(r'[A-Za-z0-9_ .+\-*/^()]*')
_PROSE = re.compile(r'\b[A-Za-z]{2,}\s+[A-Za-z]{2,}')  # "see figure 3" is not hbar*omega
_IDENT_CALL = re.compile(r'([A-Za-z_]\w*)\s*\(')
_PLAIN_FUNCTIONS = frozenset({'sqrt', 'exp', 'log', 'ln', 'sin', 'cos', 'tan', 'asin', 'acos',
                              'atan', 'sinh', 'cosh', 'tanh', 'abs', 'Abs'})
_LATEX_SUBSCRIPT = re.compile(r'(?<![\\A-Za-z])([A-Za-z])_(?:\{([A-Za-z0-9]+)\}|([A-Za-z0-9]))')
_VAR_GREEK = re.compile(r'^var(epsilon|phi|theta|rho|sigma|pi|kappa)')
_CASE_SENSITIVE = ConversionConfig(lowercase_symbols=False)
_TRANSFORMS = standard_transformations + (implicit_multiplication, convert_xor)
_REPLACEMENTS = (('−', '-'), ('\\%', '%'), ('^{\\circ}', '°'), ('^\\circ', '°'), ('\\circ', '°'),
                 ('\\degree', '°'), ('\\mu ', 'µ'), ('\\mu', 'µ'), ('\\Omega', 'Ω'),
                 ('\\AA', 'Å'), ('\\cdot', '*'), ('·', '*'), ('\\dfrac', '\\frac'),
                 ('\\tfrac', '\\frac'))


@functools.cache
def _units() -> pint.UnitRegistry:
    return pint.UnitRegistry(autoconvert_offset_to_baseunit=True)


_units()  # built at import (0.3 s), i.e. in the worker's start-up, not in the first check


@dataclass
class Parsed:
    """An answer read as a number with an optional unit, or as a sympy expression."""

    value: float | None = None
    unit: Any = None  # pint.Unit, or None for a bare number
    expr: Any = None  # sympy expression with free symbols


def _normalise(text: str) -> str:
    text = strip_latex_text(text)
    for old, new in _REPLACEMENTS:
        text = text.replace(old, new)
    text = _DEGREE_SCALE.sub(r' deg\1', text).replace('°', ' degree')
    for sep in ('\\approx', '≈', '='):
        if sep in text and not text.rstrip().endswith(sep):
            text = text.rsplit(sep, 1)[1]
    return text.strip().rstrip('.').strip()


def _parse_unit(text: str) -> Any:
    text = text.strip().replace('{', '(').replace('}', ')').replace('\\', '')
    if not text:
        return None
    return _units().parse_units(text.replace('%', 'percent'))


def _parse_expression(text: str) -> Any:
    if '\\' in text or '{' in text:
        # latex2sympy cannot read E_0 (E is Euler's number) and reads I_0 as the
        # imaginary unit: subscripted letters become plain names (E_{0} -> E0).
        return latex2sympy(_LATEX_SUBSCRIPT.sub(r'\\mathit{\1\2\3}', text),
                           conversion_config=_CASE_SENSITIVE)  # m and M differ in physics
    if _PLAIN_MATH_OK.fullmatch(text) is None or '__' in text or _PROSE.search(text):
        raise ValueError(f'not a plain math expression: {text!r}')
    for name in _IDENT_CALL.findall(text):
        if name not in _PLAIN_FUNCTIONS:
            raise ValueError(f'function {name!r} is not allowed')
    text = re.sub(r'\bln\s*\(', 'log(', text)
    return parse_expr(text, transformations=_TRANSFORMS, evaluate=True)


def _split_value_unit(text: str) -> Parsed | None:
    r"""A numeric expression followed by a unit, e.g. ``\frac{1}{2} m/s``."""
    words = text.split()
    for k in range(1, min(3, len(words) - 1) + 1):
        head, tail = ' '.join(words[:-k]), ' '.join(words[-k:])
        if not _UNIT_START.match(tail):
            continue
        try:
            unit, expr = _parse_unit(tail), _parse_expression(head)
        except Exception:  # noqa: BLE001, S112  (pint/sympy/ANTLR raise many types)
            continue
        if isinstance(expr, sympy.Expr) and not expr.free_symbols:
            value = complex(expr.evalf())
            if value.imag == 0 and math.isfinite(value.real):
                return Parsed(value=value.real, unit=unit)
    return None


def parse_answer(text: str | float, unit: str | None = None) -> Parsed | None:
    r"""Reads an answer as a quantity or an expression; ``None`` if it is neither.

    Args:
        text: the answer text (or a number).
        unit: the unit of a bare number (e.g. a record's ``unit`` field).

    Example:
        >>> p = parse_answer(r'$3.2\,\mathrm{km}$')
        >>> p.value, str(p.unit)
        (3.2, 'kilometer')
        >>> parse_answer(r'1.6 \times 10^{-19}').value
        1.6e-19
        >>> parse_answer(r'\frac{\sqrt{3}}{2}').value
        0.8660254037844386
        >>> parse_answer(r'v = \sqrt{2 g h}').expr
        sqrt(2*g*h)
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return Parsed(value=float(text), unit=_parse_unit(unit) if unit else None)
    text = _normalise(str(text))
    text = _SCI_LATEX.sub(r'e\1', text)
    text = _SCI_PLAIN.sub(r'e\1', text)
    match = _NUMBER_PREFIX.match(text)
    if match is not None:
        rest = text[match.end():].strip()
        exponent = '' if match.group(2) is None else f'e{match.group(2)}'
        value = float(match.group(1).replace(',', '') + exponent)  # exact: 1.6e-19
        if not rest:
            return Parsed(value=value, unit=_parse_unit(unit) if unit else None)
        if _UNIT_START.match(rest) or rest.startswith(('/', '(')):
            # The whole rest as the unit, else its first word ("3.2 km, i.e. ...").
            for candidate in (rest, rest.split()[0].rstrip(',;:')):
                try:
                    return Parsed(value=value, unit=_parse_unit(candidate))
                except Exception:  # noqa: BLE001, S110  (not a unit: an expression below?)
                    pass
    split = _split_value_unit(text)
    if split is not None:
        return split
    try:
        expr = _parse_expression(text)
    except Exception:  # noqa: BLE001  (not an expression either: unreadable)
        return None
    if not isinstance(expr, sympy.Expr):
        return None
    if not expr.free_symbols:
        value = complex(expr.evalf())
        if value.imag != 0 or not math.isfinite(value.real):
            return None
        return Parsed(value=value.real, unit=_parse_unit(unit) if unit else None)
    return Parsed(expr=expr)


def _close(pred: float, ref: float, rel_tol: float, abs_tol: float) -> bool:
    """``|pred - ref| <= max(rel_tol * |ref|, abs_tol)``; never for inf or nan."""
    if not (math.isfinite(pred) and math.isfinite(ref)):
        return False
    return abs(pred - ref) <= max(rel_tol * abs(ref), abs_tol)


def _same_expression(a: Any, b: Any, rel_tol: float, abs_tol: float, trials: int = 5) -> bool:
    """Whether prediction ``b`` equals reference ``a`` at ``trials`` random points.

    Symbols are matched by name, each drawn from [0.5, 2.5].
    """
    def canonical(expr: Any) -> Any:  # v_{0} = v_0 = v0, \varepsilon = \epsilon
        return expr.subs({s: sympy.Symbol(_VAR_GREEK.sub(r'\1', re.sub(r'[\\{}\s_]', '', s.name)),
                                           positive=True) for s in expr.free_symbols})
    a, b = canonical(a), canonical(b)
    if {s.name for s in a.free_symbols} != {s.name for s in b.free_symbols}:
        return False
    rng = random.Random(0)
    symbols = sorted(a.free_symbols | b.free_symbols, key=lambda s: s.name)
    for _ in range(trials):
        point = {s: rng.uniform(0.5, 2.5) for s in symbols}
        by_name = {s.name: v for s, v in point.items()}
        ref = complex(a.subs({s: by_name[s.name] for s in a.free_symbols}).evalf())
        pred = complex(b.subs({s: by_name[s.name] for s in b.free_symbols}).evalf())
        if not (_close(pred.real, ref.real, rel_tol, abs_tol)
                and _close(pred.imag, ref.imag, rel_tol, abs_tol)):
            return False
    return True


def _last_number_with_unit(text: str) -> str | None:
    r"""The last number in ``text`` with the unit written right after it, if any.

    Without the unit, ``The distance is 3200 m.`` would read as 3200 km against a
    reference in km, and ``3.2 kg`` as 3.2 km.

    Example:
        >>> _last_number_with_unit('The distance is 3200 m. Done')
        '3200 m'
        >>> _last_number_with_unit('it takes 7 steps')
        '7'
    """
    found = None
    for found in _NUMBER.finditer(text):
        pass
    if found is None:
        return None
    number = found.group(0)
    # the rest of the clause: up to a sentence end, a comma or a line break
    tail = re.split(r'[,;\n]|\.(?:\s|$)', text[found.end():], maxsplit=1)[0].strip()
    words = strip_latex_text(tail).split()
    for k in range(min(3, len(words)), 0, -1):  # longest unit first: "m / s" before "m"
        candidate = f'{number} {" ".join(words[:k])}'
        parsed = _split_value_unit(candidate)
        if parsed is not None and parsed.unit is not None:
            return candidate
    return number


def numeric_equal(completion: str, answer: Any, unit: str | None = None,
                  rel_tol: float = 1e-2, abs_tol: float = 0.0, require_unit: bool = False,
                  fallback_last_number: bool = True) -> bool:
    r"""Whether the completion's final answer equals ``answer`` within tolerance.

    The prediction is :func:`~.answer.final_answer` (last ``\boxed{}``, else the last
    "answer: ..." line), else the last number in the completion when
    ``fallback_last_number``.

    Args:
        completion: the model's full response.
        answer: the reference (number, quantity text or expression).
        unit: the reference's unit when ``answer`` is a bare number.
        rel_tol, abs_tol: equal if ``|pred - ref| <= max(rel_tol * |ref|, abs_tol)``,
            after converting the prediction to the reference's unit. ``abs_tol`` is in
            that unit; keep it 0 (default) for tiny quantities: 1e-8 would accept any
            answer to a question whose answer is 1.6e-19 C.
        require_unit: if True, a bare-number prediction for a reference with a unit is
            wrong; if False (default) it is read in the reference's unit.
        fallback_last_number: use the last number when no final answer is stated.

    Returns:
        True if equal. Units of different dimensions are unequal. A prediction with a
        unit against a bare reference compares its magnitude (``50 %`` also as 0.5).

    Example:
        >>> numeric_equal(r'so the distance is \boxed{3200\ \text{m}}', '3.2 km')
        True
        >>> numeric_equal('Answer: 3.2 s', '3.2 km')
        False
        >>> numeric_equal(r'\boxed{\frac{m v^2}{r}}', 'm*v^2/r')
        True
    """
    text = final_answer(completion)
    if text is None and fallback_last_number:
        text = _last_number_with_unit(completion)
    if text is None:
        return False
    ref = parse_answer(answer, unit)
    if ref is None:
        raise ValueError(f'cannot read the reference answer {answer!r} (unit {unit!r}) as a '
                         "number, quantity or expression; fix the record's 'answer'/'unit'")
    pred = parse_answer(text)
    if pred is None:
        return False
    if ref.expr is not None or pred.expr is not None:
        if ref.expr is None or pred.expr is None:
            return False
        return _same_expression(ref.expr, pred.expr, rel_tol, abs_tol)
    if ref.unit is not None and pred.unit is not None:
        try:
            value = _units().Quantity(pred.value, pred.unit).to(ref.unit).magnitude
        except pint.DimensionalityError:
            return False
        return _close(float(value), ref.value, rel_tol, abs_tol)
    if ref.unit is not None:
        return not require_unit and _close(pred.value, ref.value, rel_tol, abs_tol)
    candidates = [pred.value]
    if pred.unit is not None and _units().Quantity(1, pred.unit).dimensionless:
        candidates.append(float(_units().Quantity(pred.value, pred.unit).to('').magnitude))
    return any(_close(c, ref.value, rel_tol, abs_tol) for c in candidates)
