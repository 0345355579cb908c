"""docs/architecture.md's walk through one RL step names real code, in the order it runs.

Every ``file.py:Qualified.name`` of the step diagram must be a function or method defined
in that file under ``gepo_xtuner/``, and the calls the diagram lists under ``run_iter``
must appear in ``RLTrainLoop.run_iter``'s source in the diagram's order.
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


def test_the_step_lists_run_iters_calls_in_their_order():
    diagram = step_diagram()
    body = diagram[diagram.index('RLTrainLoop.run_iter'):diagram.index('-> checkpoint')]
    # the first call of each line below run_iter, as run_iter's source spells it
    firsts = []
    for line in body.splitlines()[1:]:
        refs = REF.findall(line)
        if refs and '->' in line.split(refs[0][0])[0]:
            firsts.append(refs[0])
    spelled = {'RewardRouter.__call__': 'self.rewards(',
               'AdvantageProcessor.__call__': 'self.advantage(',
               'RLLogProcessor.get_log_after_iter': "call_hook('after_train_iter'",
               'RolloutBackend.generate': 'self.rollout.generate(',
               'RolloutBackend.update_weights': 'self.rollout.update_weights('}
    loop = PACKAGE / 'engine' / 'loop.py'
    source = ast.get_source_segment(loop.read_text(), definitions(loop)['RLTrainLoop.run_iter'])
    positions = []
    for file, name in firsts:
        needle = spelled.get(name, name.rsplit('.', 1)[-1] + '(')
        assert needle in source, f'run_iter does not call {file}:{name} ({needle!r})'
        positions.append((source.index(needle), name))
    assert [n for _, n in sorted(positions)] == [n for _, n in positions], positions
    assert len(positions) >= 10, positions


def test_the_check_fails_on_a_wrong_reference(tmp_path):
    """The file:function reference finder rejects a name that is not defined."""
    assert 'RLTrainLoop._update' in definitions(PACKAGE / 'engine' / 'loop.py')
    assert 'RLTrainLoop._update' not in definitions(PACKAGE / 'engine' / 'optim_step.py')
