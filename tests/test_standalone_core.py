"""The core without the XTuner stack: what ``pip install gepo-xtuner[trl]`` (or ``[verl]``)
gives a user of another trainer.

A process in which mmengine, xtuner and lmdeploy cannot be imported (a finder first on
``sys.meta_path`` refuses them, as an environment without them would) imports the package,
builds every shipped processor and loss from its registry, and computes the same advantages
and losses, bit for bit, as this process does with mmengine's registries. The package's
metadata is checked for the same split: its requirements name none of the three outside the
``xtuner`` and ``dev`` extras.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gepo_xtuner.registry import ADVANTAGES, HAVE_MMENGINE, POLICY_LOSSES
from gepo_xtuner.standalone_registry import Registry
from tests.conftest import WITHOUT_XTUNER_STACK

ROOT = Path(__file__).resolve().parents[1]
XTUNER_STACK = ('mmengine', 'xtuner', 'lmdeploy')

#: One batch and one call per shipped processor and loss, run in both processes.
WORKLOAD = '''
import torch
from gepo_xtuner.advantage import AdvantageInputs
from gepo_xtuner.registry import ADVANTAGES, POLICY_LOSSES, shipped
g = torch.Generator().manual_seed(0)
n, t = 24, 7
batch = AdvantageInputs(rewards=torch.randint(0, 3, (n,), generator=g).double() / 2,
                        group_ids=torch.arange(n) // 4,
                        logprobs=-torch.rand(n, t, generator=g) * torch.arange(1, n + 1)[:, None] / 8,
                        mask=torch.rand(n, t, generator=g) > 0.2)
out = {}
for name in sorted(shipped(ADVANTAGES)):
    proc = ADVANTAGES.build(dict(type=name))
    state = proc.init_state()
    for step in range(2):
        out[f'{name}/{step}'] = proc(batch, state).advantages.tolist()
logp = -torch.rand(n, t, generator=g)
old = logp + 0.1 * torch.randn(n, t, generator=g)
adv = torch.randn(n, generator=g)
mask = torch.rand(n, t, generator=g) > 0.2
losses = {}
for name in sorted(shipped(POLICY_LOSSES)):
    torch.manual_seed(0)  # Clip-Cov draws the tokens it detaches
    value, _ = POLICY_LOSSES.build(dict(type=name))(logp, old, adv, mask)
    losses[name] = value.item()
'''


def _run_blocked(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-c', WITHOUT_XTUNER_STACK + code], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)


def _workload() -> dict:
    scope: dict = {}
    exec(WORKLOAD, scope)  # noqa: S102 (this module's own text)
    return scope['out'], scope['losses']


@pytest.fixture(scope='module')
def blocked() -> dict:
    """What one process without the XTuner stack computes and finds."""
    proc = _run_blocked(WORKLOAD + textwrap.dedent('''
        import json, sys
        from gepo_xtuner.registry import HAVE_MMENGINE
        stack = sorted(m for m in sys.modules if m.split('.')[0] in ('mmengine', 'xtuner', 'lmdeploy'))
        try:
            import gepo_xtuner.engine
            engine = None
        except ModuleNotFoundError as e:
            engine = e.name
        print(json.dumps(dict(out=out, losses=losses, have=HAVE_MMENGINE, stack=stack,
                              engine=engine)))
    '''))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_core_without_the_xtuner_stack_equals_it_with_mmengine(blocked):
    assert HAVE_MMENGINE  # this environment has XTuner's stack
    assert blocked['have'] is False and blocked['stack'] == []
    out, losses = _workload()
    assert sorted(blocked['out']) == sorted(out) and len(out) >= 10 and len(losses) >= 4
    # bit for bit: the same math through either registry
    assert blocked['out'] == out and blocked['losses'] == losses


def test_import_without_mmengine_names_what_needs_it(blocked):
    """The core imports; the XTuner-facing parts fail by naming mmengine."""
    assert blocked['engine'] == 'mmengine'


def test_standalone_registry_keeps_mmengines_rules():
    reg = Registry('thing', locations=['gepo_xtuner.advantage'])

    @reg.register_module()
    class Scale:
        def __init__(self, factor: float = 2.0) -> None:
            self.factor = factor

    assert reg.build(dict(type='Scale', factor=3.0)).factor == 3.0
    assert reg.build(dict(type=Scale, _scope_='gepo_xtuner')).factor == 2.0
    assert reg.get('gepo_xtuner.Scale') is Scale and 'Scale' in reg
    with pytest.raises(KeyError, match='Scale is already registered in thing'):
        reg.register_module(module=Scale)
    reg.register_module(name='Scale', force=True, module=Scale)
    with pytest.raises(KeyError, match="Missing is not in the thing registry; registered: Scale"):
        reg.build(dict(type='Missing'))
    with pytest.raises(TypeError, match='class `Scale` in .*unexpected keyword'):
        reg.build(dict(type='Scale', size=1))
    with pytest.raises(TypeError, match='a config must be a dict with a "type" key'):
        reg.build(dict(factor=1.0))


def test_standalone_registry_imports_its_locations_on_a_miss(monkeypatch):
    monkeypatch.delitem(sys.modules, 'wave', raising=False)
    reg = Registry('x', locations=['wave'])
    assert reg.get('Nothing') is None and 'wave' in sys.modules


def test_requirements_keep_the_xtuner_stack_in_its_extra():
    """The installed metadata: the base requirements and the ``trl`` extra name none of
    mmengine, xtuner, lmdeploy; the ``xtuner`` extra names XTuner and mmengine."""
    from importlib.metadata import requires
    reqs = requires('gepo-xtuner') or []

    def extra(req: str) -> str | None:
        marker = req.split(';', 1)[1] if ';' in req else ''
        return marker.split('extra ==', 1)[1].strip().strip('"\'') if 'extra ==' in marker else None

    def name(req: str) -> str:
        return req.split(';')[0].split('[')[0].split('>')[0].split('=')[0].split('<')[0].strip()

    groups: dict[str | None, set[str]] = {}
    for req in reqs:
        groups.setdefault(extra(req), set()).add(name(req).lower())
    for group in (None, 'trl', 'verl'):
        assert not groups.get(group, set()) & set(XTUNER_STACK), (group, groups.get(group))
    assert groups[None] == {'torch', 'numpy'}
    assert {'xtuner', 'mmengine'} <= groups['xtuner'] and 'trl' in groups['trl']
    assert groups['verl'] == {'verl'}


def test_pip_installs_the_trl_extra_without_the_xtuner_stack(tmp_path):
    """What ``pip install '.[trl]'`` installs into an empty environment, as pip resolves it
    against the package registry (``--dry-run --ignore-installed --report``): TRL, transformers
    and torch, and none of mmengine, xtuner, lmdeploy. (The import side, in a process where
    those cannot be imported, is ``test_trl.py``'s.)"""
    from tests.conftest import ROOT, _registry_reachable
    report = tmp_path / 'report.json'
    proc = subprocess.run(
        [sys.executable, '-m', 'pip', 'install', '--dry-run', '--ignore-installed', '-q',
         '--report', str(report), f'{ROOT}[trl]'], capture_output=True, text=True, timeout=600,
        check=False)
    if proc.returncode != 0 and not _registry_reachable(tmp_path):
        pytest.skip('the package registry cannot be reached')
    assert proc.returncode == 0, proc.stderr[-4000:]
    names = {item['metadata']['name'].lower().replace('_', '-')
             for item in json.loads(report.read_text())['install']}
    assert {'gepo-xtuner', 'trl', 'transformers', 'torch'} <= names
    assert not names & set(XTUNER_STACK), sorted(names & set(XTUNER_STACK))
