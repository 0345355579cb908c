"""The preloaded interpreter (tests/preloaded.py) gives what a fresh one gives.

Every training and tool run of the suite goes through it, so it is checked the way it is
used: the same programs through both paths, outputs compared exactly.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests import preloaded

from .conftest import scalars, train, write_config

pytestmark = pytest.mark.integration

PROGRAM = textwrap.dedent('''
    import json, os, sys
    sys.stdout.write('out:' + json.dumps({
        'argv': sys.argv[1:], 'cwd': os.getcwd(), 'env': os.environ.get('GEPO_PROBE'),
        'main': __name__, 'path0': sys.path[0], 'file': os.path.basename(__file__),
        'gepo_loaded': 'gepo_xtuner' in sys.modules}) + '\\n')
    sys.stderr.write('err line\\n')
    if sys.argv[1] == 'exit':
        sys.exit(int(sys.argv[2]))
    if sys.argv[1] == 'message':
        sys.exit('a message')
    if sys.argv[1] == 'raise':
        raise ValueError('boom')
    import atexit
    atexit.register(lambda: print('atexit ran', flush=True))
''')


def both(cmd: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, ...]:
    fresh = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    return fresh, preloaded.run(cmd, **kwargs)


@pytest.mark.parametrize('args', [['plain', 'x y'], ['exit', '3'], ['message'], ['raise']])
def test_a_script_sees_and_returns_what_a_fresh_interpreter_gives(tmp_path, args):
    script = tmp_path / 'prog.py'
    script.write_text(PROGRAM)
    env = dict(os.environ, GEPO_PROBE='probe-value')
    fresh, forked = both([sys.executable, str(script), *args], env=env, cwd=tmp_path)
    assert forked.returncode == fresh.returncode
    assert forked.stdout == fresh.stdout
    # a traceback names the runpy frames in one and not the other: compare its last line
    assert forked.stderr.splitlines()[0] == fresh.stderr.splitlines()[0] == 'err line'
    assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1]
    seen = json.loads(forked.stdout.splitlines()[0][4:])
    assert seen['argv'] == args and seen['env'] == 'probe-value' and not seen['gepo_loaded']


@pytest.mark.parametrize('threads', [{'OMP_NUM_THREADS': '1'}, {'MKL_NUM_THREADS': '1'},
                                     {'OMP_NUM_THREADS': '2'}, {}])
def test_torch_threads_follow_the_runs_environment(tmp_path, threads):
    """OpenMP reads OMP_NUM_THREADS when torch loads, in the zygote: a run still gets the
    thread count a fresh interpreter with its environment picks (a forked rank on two
    threads where its environment says one ran ten times slower on two cores)."""
    script = tmp_path / 'threads.py'
    script.write_text('import torch; print(torch.get_num_threads())\n')
    env = {k: v for k, v in os.environ.items() if k not in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS')}
    fresh, forked = both([sys.executable, str(script)], env=dict(env, **threads))
    assert fresh.returncode == forked.returncode == 0, forked.stderr[-2000:]
    assert forked.stdout == fresh.stdout


def test_an_overlay_that_prints_at_start_up_is_still_served(tmp_path):
    """What an overlay prints on stdout while the zygote starts (DeepSpeed's accelerator
    notice, imported by mmengine.runner) is not taken for the zygote's handshake: it
    serves the runs (a zygote that waited for a different first line hung the suite)."""
    overlay = tmp_path / 'overlay'
    overlay.mkdir()
    (overlay / 'sitecustomize.py').write_text('print("a notice at start-up", flush=True)\n')
    (tmp_path / 'prog.py').write_text('print("ran")\n')
    env = dict(os.environ, PYTHONPATH=str(overlay))
    proc = preloaded.run([sys.executable, str(tmp_path / 'prog.py')], env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == 'ran'
    zygote = preloaded._ZYGOTES[os.pathsep.join([str(overlay), str(preloaded.ROOT)])]
    assert not zygote.failed and zygote._proc.poll() is None  # served, not a fallback
    zygote.close()


@pytest.mark.gpu
def test_a_run_on_a_gpu_machine_can_use_cuda(tmp_path):
    """The preloaded imports ask the CUDA driver for a device count, after which torch refuses
    CUDA in a forked child ("Cannot re-initialize CUDA in forked subprocess": every forked
    training run failed so on an H100). On a machine with a GPU the zygote declines and the
    run gets a fresh interpreter; on CPU it serves (``_forks_lose_cuda``)."""
    (tmp_path / 'prog.py').write_text(
        'import torch\nprint(torch.ones(3, device="cuda").sum().item())\n')
    proc = preloaded.run([sys.executable, str(tmp_path / 'prog.py')], timeout=300)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == '3.0', proc.stderr


def test_a_module_runs_as_main_with_the_cwd_first_on_the_path(tmp_path):
    (tmp_path / 'probe_mod.py').write_text(PROGRAM)
    fresh, forked = both([sys.executable, '-m', 'probe_mod', 'plain'], cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(preloaded.ROOT)))
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    assert json.loads(forked.stdout.splitlines()[0][4:])['main'] == '__main__'


def test_a_run_past_its_timeout_is_killed(tmp_path):
    script = tmp_path / 'sleeper.py'
    script.write_text('import time\nprint("started", flush=True)\ntime.sleep(60)\n')
    with pytest.raises(subprocess.TimeoutExpired) as err:
        preloaded.run([sys.executable, str(script)], timeout=2)
    assert 'started' in err.value.output


def test_a_training_run_is_bit_identical_to_a_fresh_interpreters(tmp_path, tiny_dir):
    """Metrics and weights of the same seeded run, forked and fresh, equal exactly."""
    cfg = write_config(tmp_path)
    runs = {}
    for fresh in (True, False):
        work = tmp_path / ('fresh' if fresh else 'forked')
        train(cfg, work, tiny_dir, 'train_cfg.max_steps=2', 'randomness.seed=3', fresh=fresh)
        state = torch.load(work / 'iter_2.pth', map_location='cpu', weights_only=False)
        runs[fresh] = (scalars(work), state['state_dict'])
    volatile = ('time', 'data_time', 'eta')
    for step in runs[True][0]:
        a, b = runs[True][0][step], runs[False][0][step]
        keep = [k for k in a if k not in volatile and not k.startswith(('time/', 'perf/'))]
        assert {k: a[k] for k in keep} == {k: b.get(k) for k in keep}, step
    for name, tensor in runs[True][1].items():
        assert torch.equal(tensor, runs[False][1][name]), name


def test_an_overlay_gets_its_own_interpreter(tmp_path):
    """A PYTHONPATH overlay is imported by the run, not shadowed by what was preloaded."""
    overlay = tmp_path / 'overlay'
    (overlay / 'mmengine').mkdir(parents=True)
    (overlay / 'mmengine' / '__init__.py').write_text('__version__ = "overlay"\n')
    script = tmp_path / 'which.py'
    script.write_text('import mmengine\nprint(mmengine.__version__)\n')
    env = dict(os.environ, PYTHONPATH=f'{overlay}{os.pathsep}{preloaded.ROOT}')
    assert preloaded.run([sys.executable, str(script)], env=env).stdout.strip() == 'overlay'
