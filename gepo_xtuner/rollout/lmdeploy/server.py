"""Starting and stopping an ``lmdeploy serve api_server`` process that the trainer owns.

The process handling is :class:`~gepo_xtuner.rollout.server.process.ServerProcess`'s;
this module fills in LMDeploy's command.
"""

from pathlib import Path
from typing import Any

# runs_remote_code is imported from here by code that predates rollout/server/process.py
from ..server.process import LAUNCH_KEYS as _COMMON_KEYS
from ..server.process import ServerProcess, runs_remote_code

# run as a script by the server's interpreter (it needs LMDeploy only, not this package)
SERVE_ENTRY: str = str(Path(__file__).with_name('serve_entry.py'))

LAUNCH_KEYS: frozenset[str] = _COMMON_KEYS | {'backend', 'tp'}


class LMDeployServerProcess(ServerProcess):
    """One ``lmdeploy serve api_server`` in its own process group, its output in a log file.

    The default command is::

        PYTHON SERVE_ENTRY serve api_server MODEL_PATH --server-name HOST --server-port PORT
            --backend BACKEND --tp TP --logprobs-mode raw_logprobs --enable-abort-handling
            EXTRA_ARGS...

    where ``SERVE_ENTRY`` is :mod:`~gepo_xtuner.rollout.lmdeploy.serve_entry`'s file:
    ``python -m lmdeploy`` plus the single-GPU ``POST /update_weights`` that LMDeploy 0.18's
    one-rank executor lacks (that module's docstring says why).

    Args:
        backend: LMDeploy engine, ``'pytorch'`` (the one with logprobs and weight sync).
        tp: tensor-parallel GPUs of the server.
        trust_remote_code: start the server with ``--trust-remote-code`` (LMDeploy's default
            is off): checkpoints that ship their own code (Intern-S1-mini, ``model_type``
            ``interns1``) need it. ``None`` (default): as the trainer's policy.
        model_path, host, port (default 23333), python, extra_args, env, log_file,
            startup_timeout_s, command: as
            :class:`~gepo_xtuner.rollout.server.process.ServerProcess`.
    """

    ENGINE = 'LMDeploy'
    DEFAULT_PORT = 23333
    COMMAND = ('{python}', '{serve_entry}', 'serve', 'api_server', '{model_path}',
               '--server-name', '{host}', '--server-port', '{port}', '--backend', '{backend}',
               '--tp', '{tp}', '--logprobs-mode', 'raw_logprobs', '--enable-abort-handling')

    def __init__(self, model_path: str | None = None, host: str = '127.0.0.1',
                 port: int = 23333, backend: str = 'pytorch', tp: int = 1,
                 python: str = 'python', extra_args: list[str] | tuple[str, ...] = (),
                 env: dict[str, Any] | None = None, log_file: str | None = None,
                 startup_timeout_s: float = 900.0, command: list[str] | None = None,
                 trust_remote_code: bool | None = None) -> None:
        super().__init__(model_path, host, port, python, extra_args, env, log_file,
                         startup_timeout_s, command, trust_remote_code)
        self.backend = backend
        self.tp = int(tp)

    def fields(self, model_path: str) -> dict[str, Any]:
        return {**super().fields(model_path), 'serve_entry': SERVE_ENTRY,
                'backend': self.backend, 'tp': self.tp}


__all__ = ['LAUNCH_KEYS', 'SERVE_ENTRY', 'LMDeployServerProcess', 'runs_remote_code']
