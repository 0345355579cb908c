"""What gepo_xtuner/analysis/health.py is, as docs/architecture.md says: deterministic,
stateful checks of the logged metrics, with no I/O, no logging and no global mutable state
(the hook in engine/runtime/health_hook.py does the printing, logging and stopping)."""

import ast
import random
from pathlib import Path

from gepo_xtuner.analysis.health import build_checks

SOURCE = Path(__file__).resolve().parents[2] / 'gepo_xtuner' / 'analysis' / 'health.py'
#: the only modules health.py may import: computation and typing, nothing that reaches
#: files, loggers, processes or the network
ALLOWED_IMPORTS = {'__future__', 'abc', 'math', 'collections.abc', 'dataclasses', 'typing',
                   'advantage.base'}
#: calls that would read or write something outside the checks
IO_CALLS = {'print', 'open', 'input', 'print_log', 'getLogger', 'warn', 'system', 'exit'}


def tree() -> ast.Module:
    return ast.parse(SOURCE.read_text(), str(SOURCE))


def test_health_imports_only_computation_and_typing():
    imported = set()
    for node in ast.walk(tree()):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    assert imported <= ALLOWED_IMPORTS, imported - ALLOWED_IMPORTS


def test_health_calls_no_io_and_declares_no_global():
    found = []
    for node in ast.walk(tree()):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            found.append(f'{node.lineno}: global/nonlocal')
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else \
                func.attr if isinstance(func, ast.Attribute) else None
            if name in IO_CALLS:
                found.append(f'{node.lineno}: {name}(')
    assert not found, found


def rows(seed: int, steps: int = 60) -> list[dict[str, float]]:
    """Random metric rows that make several checks fire."""
    rng = random.Random(seed)
    out = []
    for step in range(1, steps + 1):
        out.append({'step': float(step),
                    'response/length/add': max(1.0, 100 - step * rng.uniform(0, 3)),
                    'reward/mean/add': rng.random(), 'reward/mean': rng.random(),
                    'entropy/policy/add': rng.uniform(0.0, 4.0),
                    'shaping/frac_damped_pos': rng.random(), 'shaping/frac_damped_neg': 0.0,
                    'band/low': 0.1, 'band/high': 1.0, 'adv/frac_zero': rng.random(),
                    'rollout/logprob_abs_diff': rng.uniform(0, 0.2),
                    'loss/clipfrac': rng.uniform(0, 0.4),
                    **({'val/acc': rng.random()} if step % 7 == 0 else {})})
    return out


def replay(checks, series) -> list[list[tuple[str, str, str]]]:
    return [[(f.alarm, f.domain, f.message) for name in sorted(checks)
             for f in checks[name].observe(step, row)] for step, row in enumerate(series, 1)]


def test_findings_are_a_function_of_the_rows_observed_and_the_state():
    """Two sets of checks fed the same rows decide the same; one rebuilt from another's
    state_dict half-way decides the rest the same: no state outside the checks."""
    series = rows(0)
    first, second = replay(build_checks({}), series), replay(build_checks({}), series)
    assert first == second and any(first)
    half = len(series) // 2
    original = build_checks({})
    replay(original, series[:half])
    resumed = build_checks({})
    for name, check in resumed.items():
        check.load_state_dict(original[name].state_dict())
    rest = [[(f.alarm, f.domain, f.message) for name in sorted(resumed)
             for f in resumed[name].observe(step, row)]
            for step, row in enumerate(series[half:], half + 1)]
    assert rest == first[half:]
