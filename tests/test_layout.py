"""The package's layout rules, checked on its source.

* The CPU testbed (``gepo_xtuner/testbed/``) is a leaf: no other module of the package
  imports it, so nothing training loads depends on a fixture.
* ``gepo_xtuner/engine/state/`` is the lower layer of ``engine/``: ``engine/runtime/`` may
  import it, it never imports ``engine/runtime/``.
* GEPO's defaults (the paper's alpha / beta / gamma) are written once, as the defaults of
  :class:`~gepo_xtuner.advantage.GEPOAdvantage`; everything else (the XTuner v1 adapter,
  configs) reads them from there.
"""

import ast
import inspect
import re
from pathlib import Path

import pytest

from gepo_xtuner.advantage import GEPOAdvantage

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'gepo_xtuner'
GEPO_PARAMS = ('alpha_low', 'alpha_high', 'beta_low', 'beta_high', 'gamma')


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix('').parts)
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def imported_modules(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved)."""
    name = module_name(path)
    package = name if path.name == '__init__.py' else name.rsplit('.', 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                anchor = package.split('.')
                anchor = anchor[:len(anchor) - node.level + 1]
                base = '.'.join(anchor + ([base] if base else []))
            out.add(base)
            out.update(f'{base}.{alias.name}' for alias in node.names)
    return out


def test_no_module_outside_the_testbed_imports_it():
    offenders = []
    for path in sorted(PACKAGE.rglob('*.py')):
        if 'testbed' in path.relative_to(PACKAGE).parts:
            continue
        for name in imported_modules(path):
            if name == 'gepo_xtuner.testbed' or name.startswith('gepo_xtuner.testbed.'):
                offenders.append(f'{path.relative_to(ROOT)} imports {name}')
    assert not offenders, offenders


def test_the_import_check_resolves_relative_imports():
    """The check above can fail: relative imports resolve to the modules they name."""
    assert 'gepo_xtuner.testbed.synthetic_tasks' in imported_modules(
        PACKAGE / 'testbed' / 'tiny.py')
    assert 'gepo_xtuner.data.prompts' in imported_modules(PACKAGE / 'testbed' / 'smoke.py')
    assert 'gepo_xtuner.advantage' in imported_modules(PACKAGE / 'engine' / 'loop.py')


def test_engine_state_never_imports_engine_runtime():
    """State is the lower layer: the run state and its checkpoint files need no runner glue,
    so the two packages cannot import each other in a cycle."""
    offenders = []
    for path in sorted((PACKAGE / 'engine' / 'state').rglob('*.py')):
        for name in imported_modules(path):
            if name == 'gepo_xtuner.engine.runtime' or \
                    name.startswith('gepo_xtuner.engine.runtime.'):
                offenders.append(f'{path.relative_to(ROOT)} imports {name}')
    assert not offenders, offenders


def test_the_layer_check_resolves_imports_between_the_two():
    """The check above can fail: relative imports between engine/state and engine/runtime
    resolve to the modules they name (here, the allowed direction)."""
    assert 'gepo_xtuner.engine.runtime.mmengine_private' in imported_modules(
        PACKAGE / 'engine' / 'runtime' / 'health_hook.py')
    assert 'gepo_xtuner.engine.state.resume' in imported_modules(
        PACKAGE / 'engine' / 'runtime' / 'mmengine_private.py')


def gepo_literals(path: Path) -> list[tuple[str, int]]:
    """``(name, line)`` of each numeric literal given to a GEPO parameter in ``path``'s code:
    keyword arguments, function defaults, (annotated) assignments and dict entries."""
    found = []

    def literal(node) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.keyword) and node.arg in GEPO_PARAMS and literal(node.value):
            found.append((node.arg, node.value.lineno))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.posonlyargs + node.args.args
            for arg, default in zip(args[len(args) - len(node.args.defaults):],
                                    node.args.defaults):
                if arg.arg in GEPO_PARAMS and literal(default):
                    found.append((arg.arg, default.lineno))
            for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults):
                if arg.arg in GEPO_PARAMS and default is not None and literal(default):
                    found.append((arg.arg, default.lineno))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and node.target.id in GEPO_PARAMS and node.value is not None \
                and literal(node.value):
            found.append((node.target.id, node.lineno))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value in GEPO_PARAMS and literal(value):
                    found.append((key.value, value.lineno))
    return found


def test_each_gepo_default_is_written_once_in_the_package():
    where: dict[str, list[str]] = {name: [] for name in GEPO_PARAMS}
    for path in sorted(PACKAGE.rglob('*.py')):
        for name, line in gepo_literals(path):
            where[name].append(f'{path.relative_to(ROOT)}:{line}')
    gepo = str((PACKAGE / 'advantage' / 'gepo.py').relative_to(ROOT))
    for name, places in where.items():
        assert len(places) == 1 and places[0].startswith(gepo + ':'), (name, places)
    signature = inspect.signature(GEPOAdvantage).parameters
    # the paper's values (section 3.1), as the class writes them
    assert {n: signature[n].default for n in GEPO_PARAMS} == dict(
        alpha_low=0.5, alpha_high=0.2, beta_low=0.2, beta_high=0.3, gamma=0.01)


def test_the_v1_adapter_writes_no_gepo_value():
    """Neither code nor docstrings of the XTuner v1 adapter state a default: it reads them."""
    values = {str(inspect.signature(GEPOAdvantage).parameters[n].default) for n in GEPO_PARAMS}
    pattern = re.compile(r'(?<![\d.])(' + '|'.join(re.escape(v) for v in values) + r')(?![\d])')
    for path in sorted((PACKAGE / 'integrations' / 'xtuner_v1').rglob('*.py')):
        hits = [f'{path.name}:{i}: {line.strip()}' for i, line in
                enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
        assert not hits, hits


@pytest.mark.parametrize('source, expected', [
    ("f(alpha_low=0.5)", [('alpha_low', 1)]),
    ("def f(gamma=0.01): pass", [('gamma', 1)]),
    ("class C:\n    beta_high: float = 0.3", [('beta_high', 2)]),
    ("d = {'alpha_high': 0.2}", [('alpha_high', 1)]),
    ("f(alpha_low=x)", []),
])
def test_the_literal_finder_finds_each_form(tmp_path, source, expected):
    path = tmp_path / 'm.py'
    path.write_text(source)
    assert gepo_literals(path) == expected


def test_readme_starts_with_what_to_type():
    first = (ROOT / 'README.md').read_text().splitlines()[:40]
    assert any('make demo' in line for line in first) and any('make test' in line for line in first)


def test_docs_links_resolve():
    """Every relative link of README.md, CONTRIBUTING.md and docs/*.md names a file that
    exists."""
    broken = []
    docs = [ROOT / 'README.md', ROOT / 'CONTRIBUTING.md', *sorted((ROOT / 'docs').glob('*.md'))]
    for doc in docs:
        for target in re.findall(r'\]\(([^)#\s]+)(?:#[^)]*)?\)', doc.read_text()):
            if '://' not in target and not (doc.parent / target).exists():
                broken.append(f'{doc.relative_to(ROOT)} -> {target}')
    assert not broken, broken
