"""The server entry point that gives LMDeploy 0.18's one-GPU executor its weight update.

On a GPU (H100, LMDeploy 0.18.0, one rank) ``POST /update_weights`` answered 500: the
engine builds ``UniExecutor``, which leaves ``update_params`` to ``ExecutorBase``'s
``NotImplementedError``. ``serve_entry.py`` adds the forward to the model agent; these
tests run it as the server runs it, as a script in a fresh interpreter, with LMDeploy's own
classes (the GPU check, tests/test_gpu/test_6_lmdeploy.py, pushes weights through it).
"""

import os
import subprocess
import sys
import textwrap

from gepo_xtuner.rollout.lmdeploy.server import SERVE_ENTRY


def _run(code: str) -> str:
    proc = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_lmdeploy_018_one_gpu_executor_has_no_weight_update():
    """The defect the entry point mends, as LMDeploy ships it (fails once LMDeploy adds it:
    then the entry point leaves LMDeploy's own alone, see the next test)."""
    out = _run('''
        from lmdeploy.pytorch.engine.executor.base import ExecutorBase
        from lmdeploy.pytorch.engine.executor.uni_executor import UniExecutor
        print(UniExecutor.update_params is ExecutorBase.update_params)
    ''')
    assert out.split() == ['True']


def test_the_entry_point_forwards_update_params_to_the_model_agent():
    """Imported as ``spawn`` imports it in the engine process (``__mp_main__``): the
    executor's ``update_params`` hands the request to its model agent, once."""
    out = _run(f'''
        import runpy
        runpy.run_path({SERVE_ENTRY!r}, run_name='__mp_main__')
        from lmdeploy.pytorch.engine.executor.base import ExecutorBase
        from lmdeploy.pytorch.engine.executor.uni_executor import UniExecutor
        assert UniExecutor.update_params is not ExecutorBase.update_params
        seen = []
        class Agent:
            def update_params(self, request):
                seen.append(request)
        executor = UniExecutor.__new__(UniExecutor)  # no model: only the forward is tried
        executor.model_agent = Agent()
        executor.update_params('request')
        print(seen)
        ns = runpy.run_path({SERVE_ENTRY!r}, run_name='__mp_main__')
        print(ns['add_single_gpu_weight_update']())  # defined now: left alone
    ''')
    assert out.split('\n')[:2] == ["['request']", 'False']


SPAWNED = """
import sys

def report(queue):
    from lmdeploy.pytorch.engine.executor.base import ExecutorBase
    from lmdeploy.pytorch.engine.executor.uni_executor import UniExecutor
    queue.put((sys.modules['__mp_main__'].__file__,
               UniExecutor.update_params is not ExecutorBase.update_params))
"""
SPAWNING_CLI = """
import multiprocessing as mp, sys
from spawning_cli.child import report

ctx = mp.get_context('spawn')  # as LMDeploy's engine process is started
queue = ctx.Queue()
child = ctx.Process(target=report, args=(queue, ))
child.start()
print(sys.argv[1:], *queue.get(timeout=120))
child.join()
"""

def test_a_process_the_cli_spawns_has_the_weight_update(tmp_path):
    """The CLI run by the entry point starts a process by ``spawn`` (LMDeploy starts its
    engine so): that process imports the entry point again and has the forward. (With
    ``runpy``'s ``alter_sys`` the child imported the CLI's ``__main__`` instead and
    ``POST /update_weights`` still answered 500 on the GPU.)"""
    (tmp_path / 'spawning_cli').mkdir()
    (tmp_path / 'spawning_cli' / '__init__.py').write_text('')
    (tmp_path / 'spawning_cli' / '__main__.py').write_text(SPAWNING_CLI)
    (tmp_path / 'spawning_cli' / 'child.py').write_text(SPAWNED)
    proc = subprocess.run([sys.executable, SERVE_ENTRY, '--module', 'spawning_cli', 'a', 'b'],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["['a',", "'b']", SERVE_ENTRY, 'True'], proc.stdout


def test_the_entry_point_runs_lmdeploys_cli():
    proc = subprocess.run([sys.executable, SERVE_ENTRY, 'serve', 'api_server', '--help'],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '--logprobs-mode' in proc.stdout and '--server-port' in proc.stdout
