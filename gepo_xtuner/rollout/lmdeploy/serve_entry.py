"""``lmdeploy serve ...`` with the single-GPU weight update LMDeploy 0.18 leaves out.

Run as a script by the interpreter that has LMDeploy (it imports nothing of this package,
so the server's environment need not have it)::

    PYTHON path/to/serve_entry.py serve api_server MODEL_PATH ...  # = python -m lmdeploy ...
    PYTHON path/to/serve_entry.py --module NAME ARGS...  # another CLI module (default lmdeploy)

Why: ``POST /update_weights`` (``Engine.update_params``) goes through the engine's
executor. With one GPU LMDeploy 0.18 builds its ``UniExecutor``, which does not define
``update_params``, so the call reaches ``ExecutorBase.update_params`` and the server
answers 500 (``NotImplementedError: Not Implemented.``); the Ray executor forwards it to the
model agent of each rank, which does the work (``ModelAgent.update_params``). This entry
point gives ``UniExecutor`` the same forward to its one agent before the CLI runs, and only
where LMDeploy has not defined it. The engine process is started with the ``spawn``
method, which imports the main module's file again, as ``__mp_main__``: the patch is made
at import, the CLI runs only under ``__main__``, and this file must stay the main module
while the CLI runs (``runpy`` without ``alter_sys``; with it the CLI's own ``__main__``
would be what the engine process imports, without the patch).
"""

import runpy
import sys


def add_single_gpu_weight_update() -> bool:
    """Gives LMDeploy's ``UniExecutor`` an ``update_params`` that calls its model agent's.

    Returns:
        Whether the method was added (``False``: LMDeploy defines it, or has no
        ``UniExecutor``).
    """
    try:
        from lmdeploy.pytorch.engine.executor.base import ExecutorBase
        from lmdeploy.pytorch.engine.executor.uni_executor import UniExecutor
    except ImportError:
        return False
    if getattr(UniExecutor, 'update_params', None) is not getattr(
            ExecutorBase, 'update_params', None):
        return False

    def update_params(self, request):
        """Loads pushed weights into the one rank's model (``ModelAgent.update_params``)."""
        self.model_agent.update_params(request)

    UniExecutor.update_params = update_params
    return True


add_single_gpu_weight_update()

def main(argv: list[str]) -> None:
    """Runs the CLI module (``--module NAME`` first in ``argv``, default ``lmdeploy``) as
    ``python -m`` would, with this file left as the process's main module."""
    module = 'lmdeploy'
    if argv[:1] == ['--module']:
        if len(argv) < 2:
            raise SystemExit('serve_entry.py: --module needs a module name')
        module, argv = argv[1], argv[2:]
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name='__main__', alter_sys=False)


if __name__ == '__main__':
    main(sys.argv[1:])
