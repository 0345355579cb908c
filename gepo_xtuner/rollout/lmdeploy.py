"""Rollouts from an LMDeploy API server over HTTP (``lmdeploy serve api_server``)."""

from collections.abc import Sequence
from typing import Any

import torch.distributed as dist
from torch import nn

from ..registry import ROLLOUT_BACKENDS
from .base import RolloutBackend, RolloutRequest, RolloutSample, SamplingParams
from .http_pool import HTTPPool, ServerRequestError
from .lmdeploy_protocol import (
    LMDeployProtocolError,
    build_generate_payload,
    error_message,
    group_samples,
    hint_for,
    parse_generate_response,
)
from .lmdeploy_server import LAUNCH_KEYS, LMDeployServerProcess
from .lmdeploy_weights import NCCLWeightSync, check_weight_sync, push_ipc, save_weights

START_HINT = ('lmdeploy serve api_server MODEL --server-port 23333 --backend pytorch '
              '--logprobs-mode raw_logprobs')


class LMDeployServerError(RuntimeError):
    """The server could not do what was asked (the message says what to check)."""


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _barrier() -> None:
    if _world_size() > 1:
        dist.barrier()


@ROLLOUT_BACKENDS.register_module()
class LMDeployRolloutBackend(RolloutBackend):
    """K responses per prompt from an LMDeploy server, with token ids and raw logprobs.

    Each response is one token-in/token-out ``POST /generate`` (the endpoint has no
    ``n``); up to ``max_concurrency`` requests are in flight over kept-alive
    connections, and results come back in request order. The server must run the
    PyTorch engine with ``--logprobs-mode raw_logprobs`` (log-softmax of the raw
    logits, what the training loss compares against). See ``docs/lmdeploy.md``.

    Building the backend touches neither the network nor the disk; the server is
    reached (or launched) at :meth:`attach` or the first :meth:`generate`.

    Args:
        server_url: a running server, e.g. ``'http://127.0.0.1:23333'``.
        launch: start the server as a subprocess instead; keys of
            :class:`~gepo_xtuner.rollout.lmdeploy_server.LMDeployServerProcess`:
            ``model_path`` (required), ``host`` ('127.0.0.1'), ``port`` (23333; 0 = any
            free port, single process only), ``backend`` ('pytorch'), ``tp`` (1),
            ``python`` ('python', an interpreter with LMDeploy), ``extra_args``
            (appended to the command), ``env``, ``log_file`` (default: a temporary
            file), ``startup_timeout_s`` (900), ``command`` (a full argv template with
            ``{model_path}``, ``{host}``, ``{port}``, replacing LMDeploy's command).
            Only global rank 0 launches; the other ranks connect to ``host:port``.
        max_concurrency: requests in flight at most (per trainer rank).
        timeout_s: per request; a request without an answer by then fails (no retry).
        max_retries: retries on connection errors and 5xx answers (never on 4xx).
        backoff_s: first wait between retries, doubled each time.
        weight_sync: how :meth:`update_weights` reaches the server: ``dict(mode=...)``
            with mode ``'ipc'`` (server on trainer rank 0's GPU; keys ``bucket_bytes``,
            ``dtype``, ``sleep_level``), ``'nccl'`` (server on other GPUs; keys
            ``master_address``, ``master_port``, ``group_name``, ``backend``,
            ``server_tp``, ``bucket_bytes``, ``dtype``, ``timeout_s``), ``'disk'``
            (``shared_dir``, ``keep``; needs ``launch``: the server is restarted on
            the saved weights) or ``'none'`` (weights never change, e.g. evaluation).
            ``None`` (default) makes :meth:`update_weights` raise, so a training run
            cannot silently sample from stale weights.
        sleep_wake: with mode ``'ipc'``, put the server to sleep after each
            :meth:`generate` (``POST /sleep``: KV cache freed, weights offloaded at
            ``sleep_level`` 1 or dropped at 2) so training gets the GPU memory, and wake
            it around the weight push. Ignored by the other modes.
        api_key: sent as ``Authorization: Bearer`` (servers started with ``--api-keys``).

    Raises:
        ValueError: a bad combination of arguments (the message says which).
    """

    def __init__(self, server_url: str | None = None, launch: dict | None = None,
                 max_concurrency: int = 64, timeout_s: float = 600.0, max_retries: int = 3,
                 backoff_s: float = 1.0, weight_sync: dict | None = None,
                 sleep_wake: bool = True, api_key: str | None = None) -> None:
        if (server_url is None) == (launch is None):
            raise ValueError('LMDeployRolloutBackend needs exactly one of server_url (a running '
                             "server, e.g. 'http://127.0.0.1:23333') or launch (dict(model_path="
                             f'...) to start one); got server_url={server_url!r}, '
                             f'launch={launch!r}')
        if server_url is not None and not str(server_url).startswith(('http://', 'https://')):
            raise ValueError(f"server_url must start with http:// or https://, got {server_url!r}")
        if launch is not None:
            if not isinstance(launch, dict):
                raise ValueError(f'launch must be a dict, got {type(launch).__name__}')
            unknown = set(launch) - LAUNCH_KEYS
            if unknown:
                raise ValueError(f'launch does not take {sorted(unknown)}; it takes '
                                 f'{sorted(LAUNCH_KEYS)}')
        if max_concurrency < 1 or timeout_s <= 0 or max_retries < 0 or backoff_s < 0:
            raise ValueError('need max_concurrency >= 1, timeout_s > 0, max_retries >= 0 and '
                             f'backoff_s >= 0; got {max_concurrency}, {timeout_s}, '
                             f'{max_retries}, {backoff_s}')
        self.weight_sync = check_weight_sync(weight_sync)
        mode = (self.weight_sync or {}).get('mode')
        if mode == 'disk' and launch is None:
            raise ValueError(
                "weight_sync mode 'disk' needs launch=dict(...): LMDeploy has no endpoint that "
                'loads weights from a path, so the backend restarts the server it launched on '
                "the saved weights. With server_url use mode 'ipc' or 'nccl' (or 'none').")
        if mode == 'ipc' and launch is not None and int(launch.get('tp', 1)) != 1:
            raise ValueError("weight_sync mode 'ipc' shares trainer rank 0's GPU memory, so the "
                             f"server must run with tp=1 (got launch.tp={launch['tp']}); use "
                             "mode 'nccl' for a multi-GPU server")
        self.server_url = None if server_url is None else str(server_url).rstrip('/')
        self.server = None if launch is None else LMDeployServerProcess(**launch)
        self.max_concurrency = int(max_concurrency)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.sleep_wake = bool(sleep_wake) and mode == 'ipc'
        self.api_key = api_key
        self.tokenizer: Any = None
        self.num_updates = 0
        self._pool: HTTPPool | None = None
        self._nccl: NCCLWeightSync | None = None
        self._asleep = False
        self._updated_since_sleep = True

    @property
    def url(self) -> str:
        """The server's address (for a launched server, known once it started)."""
        return self.server_url if self.server is None else self.server.url

    # ----------------------------------------------------------------- lifecycle
    def attach(self, model: nn.Module, tokenizer: Any) -> None:
        """Keeps the tokenizer (saved with disk weight sync) and reaches the server."""
        self.tokenizer = tokenizer
        self._ensure_server()

    def _ensure_server(self) -> None:
        """Launches (rank 0) or checks the server once; every rank calls it at the same point."""
        if self._pool is not None:
            return
        if self.server is not None:
            if self.server.port == 0 and _world_size() > 1:
                raise ValueError('launch.port=0 (any free port) works in one process only; set '
                                 'a fixed launch.port for multi-process training')
            if _rank() == 0:
                self.server.start()
            _barrier()
        headers = None if self.api_key is None else {'Authorization': f'Bearer {self.api_key}'}
        pool = HTTPPool(self.url, self.max_concurrency, self.timeout_s, self.max_retries,
                        self.backoff_s, headers)
        if self.server is None:
            try:
                pool.request('GET', '/health', timeout_s=min(self.timeout_s, 30.0))
            except ServerRequestError as e:
                pool.close()
                raise LMDeployServerError(
                    f'no healthy LMDeploy server at {self.url} ({e}); start one, e.g. '
                    f'`{START_HINT}`, or fix server_url') from e
        self._pool = pool
        if (self.weight_sync or {}).get('mode') == 'nccl':
            self._nccl = NCCLWeightSync(pool, self.weight_sync)

    def close(self) -> None:
        """Closes connections, tears down the NCCL group and stops a launched server."""
        if self._nccl is not None:
            self._nccl.close()
            self._nccl = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self.server is not None:
            self.server.close()

    # ---------------------------------------------------------------- generation
    def generate(self, requests: Sequence[RolloutRequest], params: SamplingParams
                 ) -> list[list[RolloutSample]]:
        """``params.n`` responses per request, ``result[i][j]`` answering ``requests[i]``.

        With ``sleep_wake`` (mode ``'ipc'``) this is collective: every rank calls it,
        also with no requests, because the server sleeps once all ranks are done.

        Raises:
            LMDeployServerError: a request failed for good; the message names the
                server, the failure and what to check.
        """
        self._ensure_server()
        if self.sleep_wake:
            if _rank() == 0 and self._asleep:
                self._wake()
            _barrier()
        payloads = [build_generate_payload(r, params) for r in requests for _ in range(params.n)]
        try:
            flat = self._pool.map(self._generate_one, payloads) if payloads else []
        except ServerRequestError as e:
            raise LMDeployServerError(self._explain(e)) from e
        except LMDeployProtocolError as e:
            raise LMDeployServerError(f'LMDeploy server {self.url}, POST /generate: {e}') from e
        if self.sleep_wake:
            _barrier()  # the server drops running requests when it goes to sleep
            if _rank() == 0:
                self._sleep()
        return group_samples(flat, params.n)

    def _generate_one(self, payload: dict) -> RolloutSample:
        return parse_generate_response(self._pool.request('POST', '/generate', json=payload))

    def _explain(self, e: ServerRequestError) -> str:
        """The error, plus what to check: a known fix, or where to look."""
        parts = [f'LMDeploy server {self.url}: {e}']
        if e.body is not None:
            hint = hint_for(error_message(e.body))
            if hint:
                parts.append(f'To fix: {hint}.')
        if self.server is not None:
            parts.append(f'Server log {self.server.log_file} ends with:\n{self.server.log_tail()}')
        elif e.status is None:
            parts.append(f'Check that the server runs and that this machine reaches it '
                         f'(curl {self.url}/health).')
        return '\n'.join(parts)

    # ------------------------------------------------------------ sleep / wake
    def _sleep(self) -> None:
        level = int(self.weight_sync.get('sleep_level', 1))
        self._call('POST', '/sleep', params={'level': level})
        self._asleep, self._updated_since_sleep = True, False

    def _wake(self, tags: list[str] | None = None) -> None:
        if tags is None and self.weight_sync.get('sleep_level', 1) == 2 \
                and not self._updated_since_sleep:
            raise LMDeployServerError(
                'the server slept with sleep_level=2, which drops its weights, and no '
                'update_weights came since; call update_weights before generating, or use '
                'sleep_level=1')
        self._call('POST', '/wakeup', params=None if tags is None else {'tags': tags})
        if tags is None or 'kv_cache' in tags:
            self._asleep = False

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            return self._pool.request(method, path, **kwargs)
        except ServerRequestError as e:
            raise LMDeployServerError(self._explain(e)) from e

    # ------------------------------------------------------------- weight sync
    def update_weights(self, model: nn.Module) -> None:
        """Makes the server sample from ``model``'s current weights (see ``weight_sync``).

        Only global rank 0 talks to the server; every rank calls this and waits at a
        barrier until the server has the new weights. ``model`` must hold full
        (unsharded) parameters on rank 0, under Hugging Face names.

        Raises:
            LMDeployServerError: no ``weight_sync`` configured, or the server refused.
        """
        if self.weight_sync is None:
            raise LMDeployServerError(
                'LMDeployRolloutBackend.update_weights: no weight_sync configured, so the '
                "server would keep sampling from its initial weights; set weight_sync=dict(mode="
                "'ipc'|'nccl'|'disk', ...) for training, or dict(mode='none') for a server "
                'whose weights never change')
        mode = self.weight_sync['mode']
        if mode == 'none':
            return
        self._ensure_server()
        if _rank() == 0:
            try:
                self._push(model, mode)
            except ServerRequestError as e:
                raise LMDeployServerError(self._explain(e)) from e
        self.num_updates += 1
        _barrier()

    def state_dict(self) -> dict[str, Any]:
        """The weight-update counter (it numbers the ``'disk'`` mode's weight files)."""
        return {'num_updates': self.num_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.num_updates = int(state.get('num_updates', self.num_updates))

    def _push(self, model: nn.Module, mode: str) -> None:
        if mode == 'ipc':
            if not all(p.is_cuda for p in model.parameters()):
                raise LMDeployServerError(
                    "weight_sync mode 'ipc' hands CUDA memory to a server on the same GPU, but "
                    "the model's parameters are on CPU; use mode 'nccl' or 'disk'")
            if self._asleep:
                self._wake(['weights'])
            push_ipc(self._pool, model, self.weight_sync)
            self._updated_since_sleep = True
            if self._asleep:
                self._wake(['kv_cache'])
        elif mode == 'nccl':
            self._nccl.push(model)
        elif mode == 'disk':
            path = save_weights(model, self.tokenizer, self.weight_sync['shared_dir'],
                                self.num_updates + 1, base_model=self.server.model_path,
                                keep=int(self.weight_sync.get('keep', 2)))
            self.server.stop()
            self.server.start(str(path))
