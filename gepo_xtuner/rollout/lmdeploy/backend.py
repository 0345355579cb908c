"""Rollouts from an LMDeploy API server over HTTP (``lmdeploy serve api_server``)."""

import glob
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
from mmengine.logging import print_log
from torch import nn

from ...registry import ROLLOUT_BACKENDS
from ..base import RolloutBackend, RolloutRequest, RolloutSample, SamplingParams
from ..server.http import HTTPPool, ServerRequestError
from .protocol import (
    LMDeployProtocolError,
    build_generate_payload,
    error_message,
    group_samples,
    has_error_detail,
    hint_for,
    parse_generate_response,
)
from .server import LAUNCH_KEYS, LMDeployServerProcess, runs_remote_code
from .weights import NCCLWeightSync, check_weight_sync, push_ipc, save_weights
from ..server.pool import ASLEEP, NoServerError, Server, ServerPool, is_asleep, is_ready

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


def _on_rank0(fn: Callable[[], Any]) -> Any:
    """``fn()`` on global rank 0 only, its result on every rank; every rank calls this.

    Where only rank 0 talks to the servers, an error there must reach the other ranks:
    they would otherwise wait forever in the next collective. So an exception on rank 0
    is raised there as it is, and on every other rank as an :class:`LMDeployServerError`
    with the same message.
    """
    outcome, error = None, None
    if _rank() == 0:
        try:
            outcome = ('ok', fn())
        except Exception as e:  # noqa: BLE001  (raised below, on every rank)
            error = e
            outcome = ('error', str(e) if isinstance(e, LMDeployServerError)
                       else f'{type(e).__name__}: {e}')
    outcome = _broadcast(outcome)
    if error is not None:
        raise error
    if outcome[0] == 'error':
        raise LMDeployServerError(outcome[1])
    return outcome[1]


@ROLLOUT_BACKENDS.register_module()
class LMDeployRolloutBackend(RolloutBackend):
    """K responses per prompt from one or several LMDeploy servers, with token ids and
    raw logprobs.

    Each response is one token-in/token-out ``POST /generate`` (the endpoint has no
    ``n``), sent to the ready server with the fewest requests outstanding (up to
    ``max_concurrency`` per server) over kept-alive connections; results come back in
    request order. A server that dies or stops answering is taken out and the requests
    it held go once more to the others (each request yields exactly one result); it is
    probed again every ``retry_after_s`` and, once healthy, rejoins at the next weight
    sync (at once when weights never change). See
    :class:`~gepo_xtuner.rollout.server.pool.ServerPool`. The servers must run the
    PyTorch engine with ``--logprobs-mode raw_logprobs`` (log-softmax of the raw
    logits, what the training loss compares against). See ``docs/lmdeploy.md`` and
    ``docs/cluster.md``.

    Building the backend touches neither the network nor the disk; the servers are
    reached (or launched) at :meth:`attach` or the first :meth:`generate`.

    Args:
        server_url: running servers: one URL, a list of URLs, or URLs separated by
            commas, e.g. ``'http://node1:23333,http://node2:23333'``.
        address_files: instead, glob pattern(s) of files written by
            ``tools/slurm_lmdeploy_server.sh`` (one per server job, lines
            ``GEPO_LMDEPLOY_URL=...`` and ``GEPO_LMDEPLOY_TP=...``). Global rank 0
            reads them at :meth:`attach` and again at each :meth:`update_weights`,
            so servers started later join the pool.
        launch: start one server as a subprocess instead; keys of
            :class:`~gepo_xtuner.rollout.lmdeploy.server.LMDeployServerProcess`:
            ``model_path`` (required), ``host`` ('127.0.0.1'), ``port`` (23333; 0 = any
            free port, single process only), ``backend`` ('pytorch'), ``tp`` (1),
            ``python`` ('python', an interpreter with LMDeploy), ``extra_args``
            (appended to the command), ``env``, ``log_file`` (default: a temporary
            file), ``startup_timeout_s`` (900), ``command`` (a full argv template with
            ``{model_path}``, ``{host}``, ``{port}``, replacing LMDeploy's command).
            Only global rank 0 launches; the other ranks connect to ``host:port``.
        max_concurrency: requests in flight at most, per server and trainer rank.
        timeout_s: how long one generation may take once the server runs it. A
            request may first wait in the server's queue (LMDeploy runs at most its
            ``--max-batch-size`` requests at once and queues the rest), so the client
            waits ``timeout_s`` times the number of queue waves, ``ceil(ranks *
            max_concurrency / server_max_batch_size)`` (:attr:`request_timeout_s`). A
            server that gives no answer by then is taken out and the request goes to
            another server (with one server: it fails).
        max_retries: retries on the same server on connection errors and 5xx answers
            (never on 4xx) before the request moves to another server.
        backoff_s: first wait between retries, doubled each time.
        retry_after_s: how long a server that was taken out waits before the next
            health probe.
        weight_sync: how :meth:`update_weights` reaches the servers: ``dict(mode=...)``
            with mode ``'ipc'`` (one server on trainer rank 0's GPU; keys
            ``bucket_bytes``, ``dtype``, ``sleep_level``), ``'nccl'`` (servers on other
            GPUs, one process group per server; keys ``master_address``,
            ``master_port`` (server ``i`` uses ``master_port + i``), ``group_name``,
            ``backend``, ``server_tp``, ``bucket_bytes``, ``dtype``, ``timeout_s``),
            ``'disk'`` (``shared_dir``, ``keep``; needs ``launch``: the server is
            restarted on the saved weights) or ``'none'`` (weights never change, e.g.
            evaluation). ``None`` (default) makes :meth:`update_weights` raise, so a
            training run cannot silently sample from stale weights.
        sleep_wake: with mode ``'ipc'``, put the server to sleep after each
            :meth:`generate` (``POST /sleep``: KV cache freed, weights offloaded at
            ``sleep_level`` 1 or dropped at 2) so training gets the GPU memory, and wake
            it around the weight push. Ignored by the other modes.
        api_key: sent as ``Authorization: Bearer`` (servers started with ``--api-keys``).
        server_max_batch_size: the servers' ``--max-batch-size`` (requests one server
            runs at once; LMDeploy's default is 128, 384 on A100/A800 and 1024 on
            H100/H800/H200), for the queue-aware timeout.

    Raises:
        ValueError: a bad combination of arguments (the message says which).
    """

    def __init__(self, server_url: str | Sequence[str] | None = None,
                 launch: dict | None = None, max_concurrency: int = 64,
                 timeout_s: float = 600.0, max_retries: int = 3, backoff_s: float = 1.0,
                 weight_sync: dict | None = None, sleep_wake: bool = True,
                 api_key: str | None = None, address_files: str | Sequence[str] | None = None,
                 retry_after_s: float = 30.0, server_max_batch_size: int = 128) -> None:
        urls = _split_urls(server_url)
        patterns = [address_files] if isinstance(address_files, str) else \
            list(address_files or [])
        given = [name for name, v in (('server_url', urls), ('address_files', patterns),
                                      ('launch', launch)) if v]
        if len(given) != 1:
            raise ValueError('LMDeployRolloutBackend needs exactly one of server_url (running '
                             "servers, e.g. 'http://127.0.0.1:23333'), address_files (files "
                             'written by tools/slurm_lmdeploy_server.sh) or launch (dict('
                             f'model_path=...) to start one); got {given or "none"}')
        for url in urls:
            if not url.startswith(('http://', 'https://')):
                raise ValueError(f'server_url must start with http:// or https://, got {url!r}')
        if launch is not None:
            if not isinstance(launch, dict):
                raise ValueError(f'launch must be a dict, got {type(launch).__name__}')
            unknown = set(launch) - LAUNCH_KEYS
            if unknown:
                raise ValueError(f'launch does not take {sorted(unknown)}; it takes '
                                 f'{sorted(LAUNCH_KEYS)}')
        if max_concurrency < 1 or timeout_s <= 0 or max_retries < 0 or backoff_s < 0 \
                or retry_after_s < 0 or server_max_batch_size < 1:
            raise ValueError('need max_concurrency >= 1, timeout_s > 0, max_retries >= 0, '
                             'backoff_s >= 0, retry_after_s >= 0 and server_max_batch_size >= 1; '
                             f'got {max_concurrency}, {timeout_s}, {max_retries}, {backoff_s}, '
                             f'{retry_after_s}, {server_max_batch_size}')
        self.weight_sync = check_weight_sync(weight_sync)
        mode = (self.weight_sync or {}).get('mode')
        if mode == 'disk' and launch is None:
            raise ValueError(
                "weight_sync mode 'disk' needs launch=dict(...): LMDeploy has no endpoint that "
                'loads weights from a path, so the backend restarts the server it launched on '
                "the saved weights. With server_url use mode 'ipc' or 'nccl' (or 'none').")
        if mode == 'ipc' and (len(urls) > 1 or patterns):
            raise ValueError("weight_sync mode 'ipc' reaches one server on trainer rank 0's GPU; "
                             "several servers (or address_files) need mode 'nccl'")
        if mode == 'ipc' and launch is not None and int(launch.get('tp', 1)) != 1:
            raise ValueError("weight_sync mode 'ipc' shares trainer rank 0's GPU memory, so the "
                             f"server must run with tp=1 (got launch.tp={launch['tp']}); use "
                             "mode 'nccl' for a multi-GPU server")
        self.server_urls = urls
        self.server_url = urls[0] if len(urls) == 1 else None
        self.address_files = patterns
        self.server = None if launch is None else LMDeployServerProcess(**launch)
        self.max_concurrency = int(max_concurrency)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.retry_after_s = float(retry_after_s)
        self.server_max_batch_size = int(server_max_batch_size)
        self.queue_waves = 1  # see request_timeout_s
        self.sleep_wake = bool(sleep_wake) and mode == 'ipc'
        self.api_key = api_key
        self.tokenizer: Any = None
        self.num_updates = 0
        self._pool: ServerPool | None = None
        self._server_tp: dict[str, int] = {}  # from address files
        self._nccl: dict[int, NCCLWeightSync] = {}  # server index -> its weight-sync group
        self._renewals: dict[int, int] = {}  # server index -> groups dropped so far
        self._asleep = False
        self._updated_since_sleep = True
        self._server_stops: frozenset[int] = frozenset()  # the server adds these itself
        self._warned_stops = False

    @property
    def url(self) -> str:
        """The (first) server's address (for a launched server, known once it started)."""
        if self.server is not None:
            return self.server.url
        if self._pool is not None:
            return ', '.join(self._pool.urls)
        return ', '.join(self.server_urls or self.address_files)

    @property
    def request_timeout_s(self) -> float:
        """How long the client waits for one ``/generate`` answer: ``timeout_s`` per
        queue wave (see ``timeout_s``; the waves are known once the servers are reached)."""
        return self.timeout_s * self.queue_waves

    @property
    def _http(self) -> HTTPPool:
        """The connection pool of the first server (the single-server modes' server)."""
        return self._pool.servers[0].http

    # ----------------------------------------------------------------- lifecycle
    def attach(self, model: nn.Module, tokenizer: Any) -> None:
        """Keeps the tokenizer (saved with disk weight sync) and reaches the servers.

        The EOS ids of ``tokenizer`` and of ``model.generation_config`` are ones
        LMDeploy stops at by itself; see :func:`~gepo_xtuner.rollout.lmdeploy.protocol.
        build_generate_payload` for why that matters to the chat template's stop words.
        """
        self.tokenizer = tokenizer
        if self.server is not None and self.server.trust_remote_code is None:
            self.server.trust_remote_code = runs_remote_code(model)  # the trainer's checkpoint
        self._server_stops = frozenset(
            _ids(getattr(tokenizer, 'eos_token_id', None))
            + _ids(getattr(getattr(model, 'generation_config', None), 'eos_token_id', None)))
        self._ensure_server()

    def _ensure_server(self) -> None:
        """Launches (rank 0) or checks the servers once; every rank calls it at the same point."""
        if self._pool is not None:
            return
        if self.server is not None:
            if self.server.port == 0 and _world_size() > 1:
                raise ValueError('launch.port=0 (any free port) works in one process only; set '
                                 'a fixed launch.port for multi-process training')
            _on_rank0(self.server.start)
        urls = [self.server.url] if self.server is not None else self.server_urls
        if self.address_files:
            urls = _on_rank0(self._read_address_files)
            if not urls:
                raise LMDeployServerError(
                    f'no LMDeploy server address in {self.address_files}: start servers with '
                    'tools/slurm_lmdeploy_server.sh (LMDEPLOY_ADDR_FILE=one file per job, '
                    'matching the pattern) and wait until they wrote their files')
        headers = None if self.api_key is None else {'Authorization': f'Bearer {self.api_key}'}
        mode = (self.weight_sync or {}).get('mode')
        # Every rank may have max_concurrency requests at a server, which runs
        # server_max_batch_size of them at once and queues the others.
        self.queue_waves = math.ceil(_world_size() * self.max_concurrency
                                     / self.server_max_batch_size)
        pool = ServerPool(urls, self.max_concurrency, self.request_timeout_s, self.max_retries,
                          self.backoff_s, headers, self.retry_after_s,
                          track_weights=mode not in (None, 'none'))
        for s in pool.servers:  # all start on the weights the trainer starts from
            pool.mark_synced(s, pool.version)
        if self.server is None:
            for s in pool.servers:
                ok, why = self._check_server(s)
                if not ok:
                    pool.mark_out(s, why)
            if not pool.ready_servers():
                pool.close()
                asleep = any(ASLEEP in s.reason for s in pool.servers)
                if any('HTTP 401' in s.reason for s in pool.servers):
                    todo = ('\nThe server wants an API key: set api_key to one of its '
                            '--api-keys')
                elif asleep:
                    todo = ('\nA sleeping server is woken by POST URL/wakeup; this backend '
                            "wakes the server it puts to sleep itself (weight_sync mode 'ipc' "
                            'with sleep_wake)')
                else:
                    todo = (f'\nStart one, e.g. `{START_HINT}`, or fix server_url / '
                            'address_files')
                raise LMDeployServerError(pool.describe_out(
                    f'no {"awake" if asleep else "healthy"} LMDeploy server at {self.url}') + todo)
        self._pool = pool

    def _check_server(self, server: Server) -> tuple[bool, str]:
        """Whether a running server can take this backend's requests; and why not.

        A server asleep (live ``GET /is_sleeping``) is fine in mode ``'ipc'`` with
        ``sleep_wake``: this backend put it to sleep (before a restart or resume, too)
        and the next :meth:`update_weights` or :meth:`generate` wakes it. Mode
        ``'ipc'`` also needs a server with one tensor-parallel rank.
        """
        timeout = min(self.timeout_s, 30.0)
        if not self.sleep_wake:
            ok, why = is_ready(server.http, timeout)
        else:
            try:
                health = server.http.request('GET', '/health', retries=0, timeout_s=timeout)
                self._asleep = is_asleep(server.http, timeout, health)
            except ServerRequestError as e:
                return False, str(e)
            # sleep_level 2 dropped the weights: only a push makes them usable again
            self._updated_since_sleep = not self._asleep or \
                self.weight_sync.get('sleep_level', 1) == 1
            ok, why = True, ''
        if ok and (self.weight_sync or {}).get('mode') == 'ipc':
            ranks = _server_ranks(server.http, timeout)
            if ranks > 1:
                raise LMDeployServerError(
                    f"weight_sync mode 'ipc' cannot push to the LMDeploy server at {server.url}: "
                    f'it runs {ranks} tensor-parallel ranks, and each of them would rebuild the '
                    "same CUDA-IPC handles of trainer rank 0's GPU on its own device. Start it "
                    "with --tp 1, or use weight_sync mode 'nccl' with server_tp="
                    f'{ranks}')
        return ok, why

    def _read_address_files(self) -> list[str]:
        """Server URLs of the address files (known ones first, new ones in name order)."""
        known = list(self._pool.urls) if self._pool is not None else []
        found = []
        for pattern in self.address_files:
            for path in sorted(glob.glob(pattern)):
                url, tp = read_address_file(path)
                self._server_tp[url] = tp
                found.append(url)
        return known + [u for u in dict.fromkeys(found) if u not in known]

    def close(self) -> None:
        """Closes connections, tears down the NCCL groups and stops a launched server."""
        for sync in self._nccl.values():
            sync.close()
        self._nccl.clear()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self.server is not None:
            self.server.close()

    def logprob_temperature(self, params: SamplingParams) -> float:
        """1 (stated, not inherited): the server runs with ``--logprobs-mode
        raw_logprobs`` and returns ``log_softmax`` of the raw logits, before the sampling
        temperature."""
        return 1.0

    def overlap_refusal(self) -> str | None:
        """Servers generate while the trainer updates, except in the colocated mode: with
        ``sleep_wake`` the server sleeps on the trainer's GPU during the update (and
        :meth:`generate` is collective), so nothing can run ahead."""
        if self.sleep_wake:
            return ("weight_sync mode 'ipc' with sleep_wake=True puts the server to sleep on "
                    "trainer rank 0's GPU while the trainer updates, so generation cannot run "
                    'meanwhile; use a separate server (weight_sync mode nccl or disk, or ipc '
                    'with sleep_wake=False when the GPU holds both) or max_staleness=0')
        return None

    def pop_metrics(self) -> dict[str, float]:
        """Per-server figures since the last call (``rollout/server/<i>/...``, see
        :meth:`~gepo_xtuner.rollout.server.pool.ServerPool.pop_metrics`)."""
        return {} if self._pool is None else self._pool.pop_metrics()

    # ---------------------------------------------------------------- generation
    def generate(self, requests: Sequence[RolloutRequest], params: SamplingParams
                 ) -> list[list[RolloutSample]]:
        """``params.n`` responses per request, ``result[i][j]`` answering ``requests[i]``.

        With ``sleep_wake`` (mode ``'ipc'``) this is collective: every rank calls it,
        also with no requests, because the server sleeps once all ranks are done.

        Raises:
            LMDeployServerError: a request failed for good, or no server is left; the
                message names the server, the failure and what to check.
        """
        self._ensure_server()
        if self.sleep_wake:
            _on_rank0(lambda: self._wake() if self._asleep else None)
        if not self._warned_stops and set(params.stop_token_ids) - self._server_stops:
            self._warned_stops = True
            print_log(f'LMDeploy: stop_token_ids {sorted(params.stop_token_ids)} go beyond the '
                      f'EOS ids the server stops at anyway ({sorted(self._server_stops)}), so '
                      "they replace the server's chat-template stop words: list those in "
                      'stop_token_ids too (docs/lmdeploy.md, "Stop tokens")', logger='current',
                      level=logging.WARNING)
        payloads = [build_generate_payload(r, params, self._server_stops)
                    for r in requests for _ in range(params.n)]
        try:
            flat = self._pool.map(_generate_one, payloads,
                                  size=lambda s: len(s.response_ids))
        except ServerRequestError as e:
            raise LMDeployServerError(self._explain(e)) from e
        except NoServerError as e:
            raise LMDeployServerError(f'{e}\nCheck that the servers run and that this machine '
                                      'reaches them (curl URL/health).') from e
        except LMDeployProtocolError as e:
            raise LMDeployServerError(f'LMDeploy server {self.url}, POST /generate: {e}') from e
        if self.sleep_wake:
            _barrier()  # the server drops running requests when it goes to sleep
            _on_rank0(self._sleep)
        return group_samples(flat, params.n)

    def _explain(self, e: ServerRequestError) -> str:
        """The error, plus what to check: a known fix, or where to look."""
        parts = [f'LMDeploy server {self.url}: {e}']
        if e.body is not None:
            hint = hint_for(error_message(e.body))
            if hint:
                parts.append(f'To fix: {hint}.')
        if e.status is not None and e.status >= 500 and not has_error_detail(e.body):
            where = (f'its log, {self.server.log_file}' if self.server is not None else
                     'the output of `lmdeploy serve api_server` there (its console or the log '
                     'file of its job)')
            parts.append('The server gave no detail: LMDeploy answers an exception in its '
                         'engine with a bare "Internal Server Error"; the traceback is in '
                         f'{where}.')
        if e.status is None and 'no answer within' in str(e) and self.queue_waves > 1:
            parts.append(f'That is timeout_s={self.timeout_s:g} s for one generation times '
                         f'{self.queue_waves} queue waves ({_world_size()} rank(s) x '
                         f'max_concurrency={self.max_concurrency} requests per server, '
                         f'server_max_batch_size={self.server_max_batch_size}).')
        if self.server is not None:
            parts.append(f'Server log {self.server.log_file} ends with:\n{self.server.log_tail()}')
        elif e.status is None:
            parts.append(f'Check that the server runs and that this machine reaches it '
                         f'(curl {e.url or self.url}/health).')
        if self._pool is not None and len(self._pool.servers) > 1:
            parts.append(self._pool.describe_out('Servers'))
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
            return self._http.request(method, path, **kwargs)
        except ServerRequestError as e:
            raise LMDeployServerError(self._explain(e)) from e

    # ------------------------------------------------------------- weight sync
    def update_weights(self, model: nn.Module) -> None:
        """Makes every server sample from ``model``'s current weights (see ``weight_sync``).

        Only global rank 0 talks to the servers; every rank calls this and waits until
        rank 0 has pushed to every ready server (with address files, also to servers
        that appeared since). Servers that were out and answer healthy again get the
        weights and rejoin; a server the push fails on is taken out, on every rank.
        ``model`` must hold full (unsharded) parameters on rank 0, under Hugging Face
        names (DDP, DeepSpeed ZeRO-1/2; not ZeRO-3).

        Raises:
            LMDeployServerError: no ``weight_sync`` configured, the single server
                refused, or no server took the weights.
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
        if any(hasattr(p, 'ds_id') for p in model.parameters()):  # on every rank: none hangs
            raise LMDeployServerError(
                'the policy is partitioned by DeepSpeed ZeRO-3: each rank holds a shard of '
                'every parameter, and pushing shards to LMDeploy servers is not supported; '
                'train with ZeRO-2 (full parameters on every rank) or DDP, see docs/cluster.md')
        self._ensure_server()
        pool = self._pool
        version = pool.version + 1

        def push() -> dict:
            if mode == 'nccl':
                return self._push_all(model, version)
            try:
                self._push(model, mode)
            except ServerRequestError as e:
                raise LMDeployServerError(self._explain(e)) from e
            return {'urls': pool.urls, 'synced': {0: version}, 'out': {}}
        _barrier()  # every rank is done generating: no request of another rank meets the push
        report = _on_rank0(push)
        for url in report['urls'][len(pool.servers):]:
            pool.add(url)
        pool.version = version
        for i, s in enumerate(pool.servers):
            if i in report['synced']:
                pool.mark_synced(s, report['synced'][i])
            else:
                pool.mark_out(s, report['out'].get(i, s.reason or 'missed a weight sync'))
        self.num_updates += 1
        if not pool.ready_servers():
            raise LMDeployServerError(pool.describe_out(
                f'weight sync {version} reached no LMDeploy server'))

    def _push_all(self, model: nn.Module, version: int) -> dict:
        """Rank 0, mode nccl: the new weights to every server that is up (one group each).

        Returns:
            ``urls`` (the pool's servers, new ones from the address files last),
            ``synced`` (index -> version pushed) and ``out`` (index -> why not).
        """
        pool = self._pool
        if self.address_files:
            try:
                for url in self._read_address_files()[len(pool.servers):]:
                    pool.add(url)
            except LMDeployServerError as e:  # the other ranks wait: keep the known servers
                print_log(f'{e}; no new servers this step', logger='current',
                          level=logging.WARNING)
        synced, out = {}, {}
        for s in pool.servers:
            if not s.ready:  # out, or new: only a server that answers healthy gets weights
                self._drop_group(s)  # it may have restarted: its side of the group is gone
                ok, why = is_ready(s.http, min(self.timeout_s, 30.0))
                if not ok:
                    out[s.index] = why
                    continue
            try:
                self._nccl_for(s).push(model)
            except (ServerRequestError, RuntimeError) as e:
                bare = isinstance(e, ServerRequestError) and (e.status or 0) >= 500 \
                    and not has_error_detail(e.body)
                out[s.index] = f'weight sync failed: {e}' + (
                    ' (no detail in the answer: the traceback is in the server log)'
                    if bare else '')
                self._drop_group(s)
                continue
            synced[s.index] = version
        return {'urls': pool.urls, 'synced': synced, 'out': out}

    def _nccl_for(self, server: Server) -> NCCLWeightSync:
        """The weight-sync group of ``server`` (a new one after it was out)."""
        sync = self._nccl.get(server.index)
        if sync is None:
            cfg = dict(self.weight_sync)
            base = cfg.get('group_name', 'gepo_weight_sync')
            renewed = self._renewals.get(server.index, 0)
            # Names and ports never repeat: the server side of a lost group may linger.
            if server.index or renewed:
                cfg['group_name'] = f'{base}_{server.index}_{renewed}'
            if cfg.get('master_port') is not None:
                cfg['master_port'] = None if renewed else int(cfg['master_port']) + server.index
            cfg.setdefault('server_tp', self._server_tp.get(server.url, 1))
            sync = self._nccl[server.index] = NCCLWeightSync(server.http, cfg)
        return sync

    def _drop_group(self, server: Server) -> None:
        sync = self._nccl.pop(server.index, None)
        if sync is not None:
            sync.close()
            self._renewals[server.index] = self._renewals.get(server.index, 0) + 1

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
            push_ipc(self._http, model, self.weight_sync)
            self._updated_since_sleep = True
            if self._asleep:
                self._wake(['kv_cache'])
        elif mode == 'disk':
            path = save_weights(model, self.tokenizer, self.weight_sync['shared_dir'],
                                self.num_updates + 1, base_model=self.server.model_path,
                                keep=int(self.weight_sync.get('keep', 2)))
            self.server.stop()
            self.server.start(str(path))


def _ids(value: Any) -> list[int]:
    """An ``eos_token_id`` (``None``, an int or a list of ints) as a list."""
    if value is None:
        return []
    return [int(value)] if isinstance(value, int) else [int(v) for v in value]


def _server_ranks(http: HTTPPool, timeout_s: float) -> int:
    """The engine's worker ranks per ``GET /update_weights_from_ipc`` (0: not told).

    LMDeploy >= 0.18's PyTorch engine on CUDA lists one entry per tensor-parallel
    rank there; other servers answer an error or an empty list.
    """
    try:
        body = http.request('GET', '/update_weights_from_ipc', retries=0, timeout_s=timeout_s)
    except ServerRequestError:
        return 0
    ranks = body.get('worker_ranks') if isinstance(body, dict) else None
    return len(ranks) if isinstance(ranks, list) else 0


def _generate_one(http: HTTPPool, payload: dict) -> RolloutSample:
    return parse_generate_response(http.request('POST', '/generate', json=payload))


def _split_urls(server_url: str | Sequence[str] | None) -> list[str]:
    """``'a,b'``, ``['a', 'b']`` or ``'a'`` as a list of URLs without trailing slashes."""
    if server_url is None:
        return []
    items = server_url.split(',') if isinstance(server_url, str) else list(server_url)
    return [str(u).strip().rstrip('/') for u in items if str(u).strip()]


def read_address_file(path: str | Path) -> tuple[str, int]:
    """``(url, tp)`` from a file of ``tools/slurm_lmdeploy_server.sh``.

    Raises:
        LMDeployServerError: a line other than ``GEPO_LMDEPLOY_URL=http(s)://...`` or
            ``GEPO_LMDEPLOY_TP=N``, or no URL line.
    """
    url, tp = None, 1
    for line in Path(path).read_text().splitlines():
        key, _, value = line.strip().partition('=')
        if not line.strip():
            continue
        if key == 'GEPO_LMDEPLOY_URL' and value.startswith(('http://', 'https://')):
            url = value.rstrip('/')
        elif key == 'GEPO_LMDEPLOY_TP' and value.isdigit() and int(value) > 0:
            tp = int(value)
        else:
            raise LMDeployServerError(f'{path}: unexpected line {line!r} (expected '
                                      'GEPO_LMDEPLOY_URL=http://HOST:PORT or GEPO_LMDEPLOY_TP=N)')
    if url is None:
        raise LMDeployServerError(f'{path} has no GEPO_LMDEPLOY_URL=http://HOST:PORT line')
    return url, tp


def _broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (no-op in one process)."""
    if _world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
