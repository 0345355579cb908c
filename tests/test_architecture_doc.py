"""docs/architecture.md's walk through one RL step names real code, in the order it runs.

Every ``file.py:Qualified.name`` of the step diagram must be a function or method defined
in that file under ``gepo_xtuner/``; the stages the diagram lists under ``run_iter`` (the
first name of each ``->`` line) must be ``RLTrainLoop.run_iter``'s calls in the diagram's
order, and every further name of a line must be called by a name before it.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / 'docs' / 'architecture.md'
PACKAGE = ROOT / 'gepo_xtuner'
REF = re.compile(r'([\w/]+\.py):([\w.]+)')


def step_diagram() -> str:
    text = DOC.read_text()
    section = text[text.index('## One RL step'):]
    return section[section.index('```') + 3:section.index('```', section.index('```') + 3)]


def definitions(path: Path) -> dict[str, ast.AST]:
    """``{'name': node, 'Class.method': node, 'Class': node}`` of a module."""
    out: dict[str, ast.AST] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    out[f'{node.name}.{item.name}'] = item
    return out


def test_every_reference_of_the_step_names_a_definition():
    refs = REF.findall(step_diagram())
    assert len(refs) >= 20, refs
    missing = []
    for file, name in refs:
        path = PACKAGE / file
        if not path.is_file() or name not in definitions(path):
            missing.append(f'{file}:{name}')
    assert not missing, f'docs/architecture.md names code that does not exist: {missing}'


#: How a call of ``name`` is spelled at its call site, where not ``<method>(``.
SPELLED = {'RewardRouter.__call__': ('self.rewards(',),
           'AdvantageProcessor.__call__': ('self.advantage(',),
           'RLLogProcessor.get_log_after_iter': ("call_hook('after_train_iter'",),
           'RolloutBackend.generate': ('self.rollout.generate(', 'self.backend.generate('),
           'RolloutBackend.update_weights': ('self.rollout.update_weights(',),
           'RLPolicy.forward': ("mode='logprobs'", 'forward(**data'),
           'PolicyLoss.__call__': ('self.policy_loss(',),
           'Validator.run': ('self.validator.run(',), 'RLTrainLoop._validate': ('self._validate(',),
           'old_logprobs': ('old_logprobs_of(', 'old_logprobs(policy')}


def source_of(file: str, name: str) -> str:
    path = PACKAGE / file
    return ast.get_source_segment(path.read_text(), definitions(path)[name])


def calls(source: str, name: str) -> bool:
    needles = SPELLED.get(name, (name.rsplit('.', 1)[-1] + '(',))
    return any(n in source for n in needles)


def stage_lines() -> list[list[tuple[str, str]]]:
    """The references of each ``->`` line under ``run_iter`` (the stages of a step)."""
    diagram = step_diagram()
    body = diagram[diagram.index('RLTrainLoop.run_iter'):diagram.index('-> checkpoint')]
    lines = []
    for line in body.splitlines()[1:]:
        refs = REF.findall(line)
        if refs and '->' in line.split(refs[0][0])[0]:
            lines.append(refs)
    return lines


def test_run_iter_is_its_stages_in_the_diagrams_order():
    """``run_iter`` makes each stage's call (the first name of each ``->`` line), in order."""
    source = source_of('engine/loop.py', 'RLTrainLoop.run_iter')
    positions = []
    for (file, name), *_ in stage_lines():
        assert calls(source, name), f'run_iter does not call {file}:{name}'
        needle = next(n for n in SPELLED.get(name, (name.rsplit('.', 1)[-1] + '(',))
                      if n in source)
        positions.append((source.index(needle), name))
    assert [n for _, n in sorted(positions)] == [n for _, n in positions], positions
    assert [n for _, n in positions][:5] == [
        'RLTrainLoop.generate', 'RLTrainLoop.score', 'RLTrainLoop.advantages', 'ppo_update',
        'RolloutBackend.update_weights'], positions  # rollout -> reward -> advantage -> update -> sync
    assert len(source.splitlines()) <= 30, 'run_iter should read on one screen'


def test_each_stage_makes_the_calls_its_line_names():
    """Every name after a stage's first is called by a name before it on the same line."""
    missing = []
    for refs in stage_lines():
        for k, (file, name) in enumerate(refs[1:], start=1):
            callers = [source_of(f, n) for f, n in refs[:k] if (PACKAGE / f).is_file()
                       and n in definitions(PACKAGE / f)]
            if not any(calls(src, name) for src in callers):
                missing.append(f'{file}:{name} (after {refs[k - 1][1]})')
    assert not missing, f'no earlier name of the line calls: {missing}'
    assert sum(len(refs) for refs in stage_lines()) >= 15


def test_nothing_outside_the_engine_uses_a_private_loop_member():
    """The testbed, benchmarks, tools and tests call the step's public functions."""
    private = re.compile(r'RLTrainLoop\._\w|\bloop_fields\b|SimpleNamespace\(policy=')
    offenders = [str(p.relative_to(ROOT)) for top in ('gepo_xtuner', 'benchmarks', 'tools')
                 for p in sorted((ROOT / top).rglob('*.py'))
                 if 'engine' not in p.relative_to(ROOT).parts and private.search(p.read_text())]
    assert not offenders, offenders


def test_the_check_fails_on_a_wrong_reference(tmp_path):
    """The file:function reference finder rejects a name that is not defined."""
    assert 'RLTrainLoop.run_iter' in definitions(PACKAGE / 'engine' / 'loop.py')
    assert 'RLTrainLoop.run_iter' not in definitions(PACKAGE / 'engine' / 'step' / 'optim_step.py')
    assert not calls('self.rollout.update_weights(x)', 'RolloutBackend.generate')


def layout_block() -> str:
    text = DOC.read_text()
    section = text[text.index('gepo_xtuner/registry.py       registries'):]
    return section[:section.index('```')]


def test_every_engine_module_is_in_the_layout():
    named = set(re.findall(r'([\w]+\.py)', layout_block()))
    modules = {p.name for p in (PACKAGE / 'engine').rglob('*.py') if p.name != '__init__.py'}
    assert not modules - named, f'engine modules docs/architecture.md does not name: ' \
                                f'{sorted(modules - named)}'


def test_every_module_the_layout_names_exists():
    files = {p.name for p in ROOT.rglob('*.py') if '.venv' not in p.parts}
    missing = {name for name in re.findall(r'([\w]+\.py)', layout_block()) if name not in files}
    assert not missing, f'docs/architecture.md names modules that do not exist: {sorted(missing)}'


def test_every_checkpoint_key_is_in_who_owns_what():
    text = DOC.read_text()
    table = text[text.index('## Who owns what'):]
    table = table[:table.index('\n## ')]
    keys = set()
    for path in PACKAGE.rglob('*.py'):
        keys |= set(re.findall(r"'(gepo_xtuner/[a-z_]+)'", path.read_text()))
    assert keys, 'no checkpoint key found in the code'
    missing = {k for k in keys if f'`{k}`' not in table}
    assert not missing, f'checkpoint keys missing from "Who owns what": {sorted(missing)}'
