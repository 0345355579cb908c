"""NumericReward: physics-style numbers with units (pint), tolerance and expressions (sympy)."""

import time

import pytest

from gepo_xtuner.reward import NumericReward
from gepo_xtuner.reward.numeric_check import parse_answer


@pytest.fixture(scope='module')
def reward():
    fn = NumericReward(timeout_s=10)
    yield fn
    fn._check.close()


@pytest.mark.parametrize('completion, record', [
    # unit conversion: km vs m
    (r'The car covers $\boxed{3200\ \mathrm{m}}$.', {'answer': '3.2 km'}),
    ('Final answer: 3,200 m.', {'answer': '3.2 km'}),
    # elementary charge in scientific notation, 1 % tolerance
    (r'$q = \boxed{1.60 \times 10^{-19}\,\mathrm{C}}$', {'answer': '1.602e-19 C'}),
    # temperature with an offset unit
    (r'The gas ends at \boxed{25\,^\circ\mathrm{C}}.', {'answer': '298.15', 'unit': 'K'}),
    # energy per mole, unit given in the record
    (r'$\Delta H = \boxed{-12\ \mathrm{kJ/mol}}$', {'answer': -12000, 'unit': 'J/mol'}),
    # bare number read in the record's unit; within 1 %
    ('so g is about 9.79', {'answer': 9.81, 'unit': 'm/s^2'}),
    # pressure: 2.43e5 Pa is 2.4 atm to 1 %
    (r'$p = \boxed{2.43 \times 10^{5}\ \mathrm{Pa}}$', {'answer': '2.4 atm'}),
    # angle in degrees against radians
    (r'$\theta = \boxed{30^\circ}$', {'answer': r'\frac{\pi}{6}', 'unit': 'rad'}),
    # percent against a fraction
    (r'The efficiency is \boxed{40\%}.', {'answer': '0.4'}),
    # symbolic answers (CMPhysBench style), equal up to algebra and spelling
    (r'$v = \boxed{\sqrt{2 g h}}$', {'answer': 'sqrt(2*g*h)'}),
    (r'\boxed{\frac{q^2}{4\pi\epsilon_0 r}}', {'answer': r'\frac{q^{2}}{4 \pi \varepsilon_{0} r}'}),
    (r'\boxed{\frac{1}{2}\hbar\omega}', {'answer': r'\hbar \omega / 2'}),
    (r'$E = \boxed{k_B T \ln 2}$', {'answer': r'\ln(2) k_{B} T'}),
])
def test_equal_quantities_and_expressions(reward, completion, record):
    assert reward(completion, record) == 1.0


@pytest.mark.parametrize('completion, record', [
    (r'\boxed{3200\ \mathrm{s}}', {'answer': '3.2 km'}),  # wrong dimension
    (r'\boxed{3.2\ \mathrm{m}}', {'answer': '3.2 km'}),  # wrong by 1000x
    # off by 10x at 1e-19: an absolute tolerance would have accepted it
    (r'\boxed{1.6 \times 10^{-18}\ \mathrm{C}}', {'answer': '1.602e-19 C'}),
    ('so g is about 9.5', {'answer': 9.81, 'unit': 'm/s^2'}),  # 3 % off
    (r'\boxed{2.4 \times 10^{5}\ \mathrm{Pa}}', {'answer': '2.4 atm'}),  # 1.3 % off
    (r'\boxed{310\ \mathrm{K}}', {'answer': '25 degC'}),
    (r'\boxed{\sqrt{g h}}', {'answer': 'sqrt(2*g*h)'}),  # missing factor
    (r'\boxed{\frac{M g}{2}}', {'answer': r'\frac{m g}{2}'}),  # M and m differ
    (r'\boxed{v_0 t}', {'answer': '42'}),  # expression for a number
    # overflows to inf at every sample point: never "close"
    (r'\boxed{9^{9^{9}} x}', {'answer': 'x'}),
    ('I am not sure.', {'answer': '1.0'}),
    # code in the answer is never evaluated
    (r'\boxed{__import__("os").getpid()}', {'answer': '1'}),
])
def test_unequal_answers_score_zero(reward, completion, record):
    assert reward(completion, record) == 0.0


def test_tolerances_and_unit_policy_are_configurable():
    strict = NumericReward(rel_tol=1e-4, require_unit=True)
    loose = NumericReward(rel_tol=0.05, abs_tol=1e-3)
    try:
        assert strict('Answer: 9.81', {'answer': 9.81, 'unit': 'm/s^2'}) == 0.0  # no unit
        assert strict(r'\boxed{9.8101\ m/s^2}', {'answer': 9.81, 'unit': 'm/s^2'}) == 1.0
        assert strict(r'\boxed{9.79\ m/s^2}', {'answer': 9.81, 'unit': 'm/s^2'}) == 0.0
        assert loose(r'\boxed{0.0009}', {'answer': 0}) == 1.0  # abs_tol near zero
        assert loose(r'\boxed{10.4}', {'answer': 10}) == 1.0
    finally:
        strict._check.close()
        loose._check.close()
    with pytest.raises(ValueError, match='rel_tol and abs_tol must be >= 0'):
        NumericReward(rel_tol=-1)


def test_no_last_number_fallback_when_disabled():
    fn = NumericReward(fallback_last_number=False)
    try:
        assert fn('we get 42 in the end', {'answer': 42}) == 0.0
        assert fn('Answer: 42', {'answer': 42}) == 1.0
    finally:
        fn._check.close()


def test_unreadable_reference_is_an_error(reward):
    with pytest.raises(Exception, match="cannot read the reference answer"):
        reward(r'\boxed{1}', {'answer': 'see figure 3'})
    with pytest.raises(ValueError, match="has no 'answer'"):
        reward(r'\boxed{1}', {'id': 'p7'})


def test_a_huge_power_times_out():
    fn = NumericReward(timeout_s=1)
    try:
        assert fn(r'\boxed{1}', {'answer': '1'}) == 1.0  # worker started before timing
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            fn(r'\boxed{x^{9^{9^{9}}}}', {'answer': 'x'})
        assert time.monotonic() - start < 3
    finally:
        fn._check.close()


def test_parse_answer_reads_units_and_scientific_notation():
    p = parse_answer(r'$1.6 \times 10^{-19}\,\mathrm{C}$')
    assert p.value == 1.6e-19 and str(p.unit) == 'coulomb'
    assert parse_answer('3,200').value == 3200
    assert parse_answer(r'\frac{1}{2} m/s').value == 0.5
    assert parse_answer('hello world') is None


@pytest.mark.parametrize('completion, expected', [
    ('The distance is 3200 m.', 1.0),   # unit written after the last number, no "answer:"
    ('so it weighs 3.2 kg', 0.0),        # another dimension: not read as 3.2 km
    ('time 3.2 s and more', 0.0),
    ('it is 3.2', 1.0),                  # a bare number is read in the reference's unit
])
def test_unstated_final_answer_keeps_its_unit(completion, expected):
    assert NumericReward()(completion, {'answer': 3.2, 'unit': 'km'}) == expected
