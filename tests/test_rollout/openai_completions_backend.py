"""A third server engine, written on ``gepo_xtuner/rollout/server/`` as an engine outside
the package would write it: an OpenAI-compatible ``POST /v1/completions`` server (the
prompt as token ids, ``logprobs``), whose weights are pushed as checkpoint files it
reloads (``POST /reload``).

The base does the rest: server URLs or a launch, rank 0's launch and readiness wait,
the server pool with failover, the weight-push round, weight files, errors. The launch
command here starts ``openai_completions_standin.py``, the tests' stand-in server.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from gepo_xtuner.rollout import RolloutRequest, RolloutSample, SamplingParams
from gepo_xtuner.rollout.server import (
    HTTPPool,
    ServerBackendError,
    ServerProcess,
    ServerRequestError,
    ServerRolloutBackend,
)

STANDIN = str(Path(__file__).with_name('openai_completions_standin.py'))


class CompletionsError(ServerBackendError):
    """The completions server could not do what was asked."""


class CompletionsProtocolError(ValueError):
    """An answer that is not what ``/v1/completions`` promises."""


class CompletionsServerProcess(ServerProcess):
    """The stand-in server, launched as ``PYTHON STANDIN MODEL --host H --port P``."""

    ENGINE = 'completions'
    COMMAND = ('{python}', '{script}', '{model_path}', '--host', '{host}', '--port', '{port}')

    def fields(self, model_path: str) -> dict[str, Any]:
        return {**super().fields(model_path), 'script': STANDIN}


class CompletionsRolloutBackend(ServerRolloutBackend):
    """K responses per prompt, one ``/v1/completions`` request with ``n=K`` each.

    Args:
        weight_sync: ``dict(mode='files', shared_dir=None, keep=2)`` (the policy saved
            under ``shared_dir``, then ``POST /reload`` per server) or
            ``dict(mode='none')``; ``None``: :meth:`update_weights` raises.
        model_name: the ``model`` of each request.
        **kwargs: as :class:`~gepo_xtuner.rollout.server.backend.ServerRolloutBackend`.
    """

    ENGINE = 'completions'
    PROCESS = CompletionsServerProcess
    ERROR = CompletionsError

    def __init__(self, server_url: str | Sequence[str] | None = None,
                 launch: dict | None = None, weight_sync: dict | None = None,
                 model_name: str = 'policy', **kwargs: Any) -> None:
        if weight_sync is not None and weight_sync.get('mode') not in ('files', 'none'):
            raise ValueError(f"weight_sync mode must be 'files' or 'none', got {weight_sync!r}")
        super().__init__(server_url, launch, weight_sync=weight_sync, **kwargs)
        self.model_name = model_name

    def overlap_refusal(self) -> str | None:
        return None  # a server generates while the trainer updates

    def generate(self, requests: Sequence[RolloutRequest], params: SamplingParams
                 ) -> list[list[RolloutSample]]:
        self._ensure_server()
        bodies = [{'model': self.model_name, 'prompt': r.prompt_ids, 'n': params.n,
                   'max_tokens': params.max_new_tokens, 'temperature': params.temperature,
                   'top_p': params.top_p, 'stop_token_ids': list(params.stop_token_ids),
                   'logprobs': 0, 'return_token_ids': True} for r in requests]
        return self._map(_complete, bodies,
                         size=lambda group: sum(len(s.response_ids) for s in group),
                         path='POST /v1/completions',
                         protocol_errors=(CompletionsProtocolError, ))

    def _push_weights(self, model: nn.Module, version: int) -> dict:
        cfg = self.weight_sync
        path = self._save_weight_files(model, version, cfg.get('shared_dir'),
                                       int(cfg.get('keep', 2)))
        synced, out = {}, {}
        for server, why in self._servers_to_push():
            if why is None:
                try:
                    server.http.request('POST', '/reload', json={'path': str(path)},
                                        timeout_s=self.timeout_s)
                    synced[server.index] = version
                    continue
                except ServerRequestError as e:
                    why = f'reload of {path} failed: {e}'
            out[server.index] = why
        return {'synced': synced, 'out': out}


def _complete(http: HTTPPool, body: dict) -> list[RolloutSample]:
    answer = http.request('POST', '/v1/completions', json=body)
    try:
        choices = sorted(answer['choices'], key=lambda c: c['index'])
        group = [RolloutSample([int(t) for t in c['token_ids']],
                               [float(x) for x in c['logprobs']['token_logprobs']],
                               c['finish_reason']) for c in choices]
    except (KeyError, TypeError, ValueError) as e:
        raise CompletionsProtocolError(f'unexpected answer {str(answer)[:200]}: {e!r}') from e
    if len(group) != body['n'] or any(len(s.response_ids) != len(s.logprobs) for s in group):
        raise CompletionsProtocolError(f'asked {body["n"]} choices with a logprob per token, '
                                       f'got {str(answer)[:200]}')
    return group
