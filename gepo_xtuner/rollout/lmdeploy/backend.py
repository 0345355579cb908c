"""Rollouts from an LMDeploy API server over HTTP (``lmdeploy serve api_server``)."""

import glob
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmengine.logging import print_log
from torch import nn

from ...ops.distributed import dist_world_size
from ...registry import ROLLOUT_BACKENDS
from ..base import RolloutRequest, RolloutSample, SamplingParams
from ..server.backend import (
    PROBE_TIMEOUT_S,
    ServerBackendError,
    ServerRolloutBackend,
    barrier,
)
from ..server.http import HTTPPool, ServerRequestError
from ..server.pool import Server, is_asleep
from .protocol import (
    LMDeployProtocolError,
    build_generate_payload,
    build_probe_payload,
    error_message,
    group_samples,
    has_error_detail,
    hint_for,
    parse_generate_response,
    parse_probe,
)
from .server import LAUNCH_KEYS, LMDeployServerProcess
from .weights import NCCLWeightSync, check_weight_sync, push_ipc

START_HINT = ('lmdeploy serve api_server MODEL --server-port 23333 --backend pytorch '
              '--logprobs-mode raw_logprobs')


class LMDeployServerError(ServerBackendError):
    """The server could not do what was asked (the message says what to check)."""


@ROLLOUT_BACKENDS.register_module()
class LMDeployRolloutBackend(ServerRolloutBackend):
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
            training run cannot silently sample from stale weights. The pushing modes
            take ``probe_tolerance`` (default 1.0; ``None`` switches it off): after each
            push every server scores a fixed probe sequence (``/generate`` with
            ``logprob_start_len=0``), which must be within that many nats per token of the
            trainer's logprobs and must have changed if the trainer's did
            (:mod:`~gepo_xtuner.rollout.server.probe`); a server that fails is taken out.
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

    ENGINE = 'LMDeploy'
    #: ``/generate`` has no ``n``: every response is its own request
    request_per_response = True
    PROCESS = LMDeployServerProcess
    LAUNCH_KEYS = LAUNCH_KEYS
    ERROR = LMDeployServerError
    SOURCES = {'server_url': "running servers, e.g. 'http://127.0.0.1:23333'",
               'address_files': 'files written by tools/slurm_lmdeploy_server.sh',
               'launch': 'dict(model_path=...) to start one'}
    #: a launched server answered ``/health`` at its start, and sleeps only when told to
    CHECK_LAUNCHED = False
    #: ``/generate`` scores given tokens (``logprob_start_len``): pushes are checked
    SCORES_PROBE = True
    PROTOCOL_ERRORS = (LMDeployProtocolError, )
    #: LMDeploy's API server lists its model there (another service does not)
    IDENTITY_PATH = '/v1/models'
    ABORT_PATH = '/abort_request'
    ABORT_BODY = {'abort_all': True}

    def __init__(self, server_url: str | Sequence[str] | None = None,
                 launch: dict | None = None, max_concurrency: int = 64,
                 timeout_s: float = 600.0, max_retries: int = 3, backoff_s: float = 1.0,
                 weight_sync: dict | None = None, sleep_wake: bool = True,
                 api_key: str | None = None, address_files: str | Sequence[str] | None = None,
                 retry_after_s: float = 30.0, server_max_batch_size: int = 128) -> None:
        patterns = [address_files] if isinstance(address_files, str) else \
            list(address_files or [])
        super().__init__(server_url, launch, max_concurrency=max_concurrency,
                         timeout_s=timeout_s, max_retries=max_retries, backoff_s=backoff_s,
                         retry_after_s=retry_after_s, api_key=api_key,
                         sources={'address_files': patterns},
                         numbers={'server_max_batch_size': (server_max_batch_size, 1, False)})
        urls = self.server_urls
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
        self.server_url = urls[0] if len(urls) == 1 else None
        self.address_files = patterns
        self.server_max_batch_size = int(server_max_batch_size)
        self.queue_waves = 1  # see request_timeout_s
        self.sleep_wake = bool(sleep_wake) and mode == 'ipc'
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

    def start_hint(self) -> str:
        return START_HINT

    # ----------------------------------------------------------------- lifecycle
    def attach(self, model: nn.Module, tokenizer: Any) -> None:
        """Keeps the tokenizer (saved with disk weight sync) and reaches the servers.

        The EOS ids of ``tokenizer`` and of ``model.generation_config`` are ones
        LMDeploy stops at by itself; see :func:`~gepo_xtuner.rollout.lmdeploy.protocol.
        build_generate_payload` for why that matters to the chat template's stop words.
        """
        self._server_stops = frozenset(
            _ids(getattr(tokenizer, 'eos_token_id', None))
            + _ids(getattr(getattr(model, 'generation_config', None), 'eos_token_id', None)))
        super().attach(model, tokenizer)

    def _ensure_server(self) -> None:
        """Launches (rank 0) or checks the servers once; every rank calls it at the same point."""
        if self._pool is None:
            # Every rank may have max_concurrency requests at a server, which runs
            # server_max_batch_size of them at once and queues the others.
            self.queue_waves = math.ceil(dist_world_size() * self.max_concurrency
                                         / self.server_max_batch_size)
        super()._ensure_server()

    def _server_urls(self) -> list[str]:
        """The address files' servers (read on rank 0), else as configured."""
        if not self.address_files:
            return super()._server_urls()
        urls = self._on_rank0(self._read_address_files)
        if not urls:
            raise LMDeployServerError(
                f'no LMDeploy server address in {self.address_files}: start servers with '
                'tools/slurm_lmdeploy_server.sh (LMDEPLOY_ADDR_FILE=one file per job, '
                'matching the pattern) and wait until they wrote their files')
        return urls

    def _asleep_hint(self) -> str:
        return ('A sleeping server is woken by POST URL/wakeup; this backend wakes the server it '
                "puts to sleep itself (weight_sync mode 'ipc' with sleep_wake)")

    def _check_server(self, server: Server) -> tuple[bool, str]:
        """Whether a running server can take this backend's requests; and why not.

        A server asleep (live ``GET /is_sleeping``) is fine in mode ``'ipc'`` with
        ``sleep_wake``: this backend put it to sleep (before a restart or resume, too)
        and the next :meth:`update_weights` or :meth:`generate` wakes it. Mode
        ``'ipc'`` also needs a server with one tensor-parallel rank.
        """
        timeout = min(self.timeout_s, PROBE_TIMEOUT_S)
        if not self.sleep_wake:
            ok, why = super()._check_server(server)
        else:
            try:
                health = server.http.request('GET', '/health', retries=0, timeout_s=timeout)
                self._asleep = is_asleep(server.http, timeout, health)
            except ServerRequestError as e:
                return False, str(e)
            # sleep_level 2 dropped the weights: only a push makes them usable again
            self._updated_since_sleep = not self._asleep or \
                self.weight_sync.get('sleep_level', 1) == 1
            ok, why = self._check_identity(server, timeout)
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
        super().close()

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

    def partial_refusal(self) -> str | None:
        """None, except in the colocated mode: :meth:`preempt` sends ``POST
        /abort_request`` (``abort_all``), and LMDeploy answers each aborted ``/generate``
        with the tokens and logprobs it had (``finish_reason`` ``'abort'``)."""
        return self.overlap_refusal()

    def _abort_refused_hint(self) -> str:
        return ('; start the server with --enable-abort-handling (a server the backend '
                'launches gets it)')

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
            self._on_rank0(lambda: self._wake() if self._asleep else None)
        if not self._warned_stops and set(params.stop_token_ids) - self._server_stops:
            self._warned_stops = True
            print_log(f'LMDeploy: stop_token_ids {sorted(params.stop_token_ids)} go beyond the '
                      f'EOS ids the server stops at anyway ({sorted(self._server_stops)}), so '
                      "they replace the server's chat-template stop words: list those in "
                      'stop_token_ids too (docs/lmdeploy.md, "Stop tokens")', logger='current',
                      level=logging.WARNING)
        payloads = [build_generate_payload(r, params, self._server_stops)
                    for r in requests for _ in range(params.n)]
        with self._epoch_lock:
            epoch, partial = self._epoch, self._partial

        def send(http: HTTPPool, payload: dict) -> RolloutSample:
            if epoch != self._epoch:  # preempted before it was sent: nothing generated
                return RolloutSample([], [], 'abort')
            # the module's _generate_one, looked up at each call (tests wrap it)
            return _generate_one(http, payload, partial)

        flat = self._map(send, payloads, size=lambda s: len(s.response_ids),
                         path='POST /generate', protocol_errors=(LMDeployProtocolError, ))
        if self.sleep_wake:
            barrier()  # the server drops running requests when it goes to sleep
            self._on_rank0(self._sleep)
        return group_samples(flat, params.n)

    def _hints(self, e: ServerRequestError) -> list[str]:
        """A known fix for the server's message, or where its traceback is."""
        parts = []
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
                         f'{self.queue_waves} queue waves ({dist_world_size()} rank(s) x '
                         f'max_concurrency={self.max_concurrency} requests per server, '
                         f'server_max_batch_size={self.server_max_batch_size}).')
        return parts

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

    # ------------------------------------------------------------- weight sync
    # update_weights is the base's: every rank waits, rank 0 runs _push_weights, every
    # rank learns which servers took the weights (with address files, also servers that
    # appeared since).
    def _weight_sync_modes(self) -> str:
        return "mode 'ipc'|'nccl'|'disk', ..."

    def _score(self, http: HTTPPool, ids: Sequence[int], timeout_s: float) -> list[float]:
        """One ``/generate`` that scores ``ids`` (the push check's probe)."""
        return _score_probe(http, ids, timeout_s)

    def _push_weights(self, model: nn.Module, version: int) -> dict:
        """Rank 0: mode nccl reaches every server (:meth:`_push_all`); ipc and disk
        reach the single server."""
        mode = self.weight_sync['mode']
        if mode == 'nccl':
            return self._push_all(model, version)
        try:
            self._push(model, mode)
        except ServerRequestError as e:
            raise LMDeployServerError(self._explain(e)) from e
        return {'urls': self._pool.urls, 'synced': {0: version}, 'out': {}}

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
                ok, why = self._probe(s)
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
            path = self._save_weight_files(model, self.num_updates + 1,
                                           self.weight_sync['shared_dir'],
                                           int(self.weight_sync.get('keep', 2)),
                                           base_model=self.server.model_path)
            self.server.stop()
            self.server.start(str(path))


def _score_probe(http: HTTPPool, ids: Sequence[int], timeout_s: float) -> list[float]:
    return parse_probe(http.request('POST', '/generate', timeout_s=timeout_s,
                                    json=build_probe_payload(ids)), ids)


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


def _generate_one(http: HTTPPool, payload: dict, partial: bool = False) -> RolloutSample:
    """One ``/generate`` (``partial``: an ``'abort'`` answer is a response so far)."""
    return parse_generate_response(http.request('POST', '/generate', json=payload), partial)


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
