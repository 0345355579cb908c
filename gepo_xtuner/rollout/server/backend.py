"""The engine-independent part of a rollout backend that samples from inference servers.

:class:`ServerRolloutBackend` owns what every server backend does the same way: the
servers' addresses and their checks, the launch settings, launching one server on
global rank 0 (or attaching to running ones) and telling every rank where they are,
the readiness check, the :class:`~gepo_xtuner.rollout.server.pool.ServerPool`, the
weight-push round (every rank waits, rank 0 pushes, every rank learns which servers
took the weights), weight files, the abort of requests in flight, and errors that say
what to check. An engine's subclass writes only what is its own: the request and
answer of one generation, the weight-update calls, the launch command
(a :class:`~gepo_xtuner.rollout.server.process.ServerProcess` subclass) and its
extra endpoints (sleep and wake, pause and resume).
"""

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import httpx
import torch.distributed as dist
from mmengine.logging import print_log
from torch import nn

from ...ops.distributed import dist_rank, dist_world_size
from ..base import RolloutBackend
from .http import HTTPPool, ServerRequestError
from .pool import ASLEEP, NoServerError, Server, ServerPool, is_ready
from .probe import (
    DEFAULT_TOLERANCE,
    ProbeRecord,
    judge,
    max_abs_diff,
    probe_ids,
    trainer_logprobs,
    vocab_size,
)
from .process import LAUNCH_KEYS, ServerProcess, runs_remote_code
from .weights import WeightDir, save_weights

T = TypeVar('T')

#: seconds :meth:`ServerRolloutBackend.abort` waits before it asks the servers again to
#: abort while requests of the aborted call are in flight: the first wait, doubled each
#: time up to the second
ABORT_RESEND_S = (0.05, 1.0)

#: how long one readiness probe of a running server may take at most
PROBE_TIMEOUT_S = 30.0
#: how long a later probe waits for a server that gave no answer before (a hung server
#: costs one bounded wait, not the full probe on every later push)
HUNG_PROBE_S = 2.0
#: how long the resume after a failed pause may take (resuming is instant on a server
#: that answers at all; a hung one must not cost a second ``timeout_s``)
RESUME_AFTER_FAILURE_S = 10.0
#: in the message of a request that got no answer in time (:class:`HTTPPool`'s wording)
_NO_ANSWER = 'no answer within'


class ServerBackendError(RuntimeError):
    """A server could not do what was asked (the message says what to check).

    Each engine's backend raises its own subclass (:attr:`ServerRolloutBackend.ERROR`).
    """


def split_urls(server_url: str | Sequence[str] | None) -> list[str]:
    """``'a,b'``, ``['a', 'b']`` or ``'a'`` as a list of URLs without trailing slashes."""
    if server_url is None:
        return []
    items = server_url.split(',') if isinstance(server_url, str) else list(server_url)
    return [str(u).strip().rstrip('/') for u in items if str(u).strip()]


def barrier() -> None:
    """Waits for every rank (no-op in one process)."""
    if dist_world_size() > 1:
        dist.barrier()


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (no-op in one process)."""
    if dist_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_rank0(fn: Callable[[], T], error: type[Exception] = ServerBackendError) -> T:
    """``fn()`` on global rank 0 only, its result on every rank; every rank calls this.

    Where only rank 0 talks to the servers, an error there must reach the other ranks:
    they would otherwise wait forever in the next collective. So an exception on rank 0
    is raised there as it is, and on every other rank as an ``error`` with the same
    message (an ``error`` keeps its text; any other exception is prefixed with its type).
    """
    outcome, failure = None, None
    if dist_rank() == 0:
        try:
            outcome = ('ok', fn())
        except Exception as e:  # noqa: BLE001  (raised below, on every rank)
            failure = e
            outcome = ('error', str(e) if isinstance(e, error) else f'{type(e).__name__}: {e}')
    outcome = broadcast(outcome)
    if failure is not None:
        raise failure
    if outcome[0] == 'error':
        raise error(outcome[1])
    return outcome[1]


class ServerRolloutBackend(RolloutBackend):
    """Rollouts from one or several inference servers over HTTP; an engine subclasses it.

    A subclass sets the class attributes below and implements :meth:`generate` (its
    request per response or group, dispatched with :meth:`_map`) and
    :meth:`_push_weights` (rank 0's weight push to every server); it may override the
    hooks :meth:`_check_server` (what readiness means beyond ``GET /health``),
    :meth:`_hints` (engine-specific advice in errors), :meth:`_server_urls` (other ways
    to find servers), :meth:`_on_pool` (what to learn from the servers once reached),
    :meth:`_pause` / :meth:`_resume` and :attr:`ABORT_PATH`. An engine that can score a
    given token sequence sets :attr:`SCORES_PROBE` and implements :meth:`_score`: every
    push is then checked by a probe (:mod:`~gepo_xtuner.rollout.server.probe`), on by
    default (:attr:`probe_tolerance`). An engine with an endpoint that only it answers
    names it in :attr:`IDENTITY_PATH`, so that an address where something else answers
    is told apart at attach.

    Building the backend touches neither the network nor the disk; the servers are
    reached (or launched) at :meth:`attach` or the first :meth:`generate`.

    Args:
        server_url: running servers: one URL, a list of URLs, or URLs separated by
            commas, e.g. ``'http://node1:8000,http://node2:8000'``.
        launch: start one server as a subprocess instead: the keyword arguments of
            :attr:`PROCESS` (``model_path`` at least). Only global rank 0 launches; the
            other ranks connect to ``host:port`` (so ``port=0``, any free port, works in
            one process only).
        max_concurrency: requests in flight at most, per server and trainer rank.
        timeout_s: how long one request may take (see :attr:`request_timeout_s`).
        max_retries: retries on the same server on connection errors and 5xx answers
            (never on 4xx) before the request moves to another server.
        backoff_s: first wait between retries, doubled each time.
        retry_after_s: how long a server that was taken out waits before the next
            health probe.
        api_key: sent as ``Authorization: Bearer``.
        weight_sync: the engine's weight-sync settings, already checked by the subclass
            (``None``: :meth:`update_weights` raises; ``dict(mode='none')``: the weights
            never change). ``probe_tolerance``: see :attr:`probe_tolerance`.
        sources: further ways the subclass offers to name servers, name -> what was
            given (e.g. LMDeploy's ``address_files``); exactly one source may be given.
        numbers: further settings with a lower bound, name -> ``(value, bound, strict)``
            (``strict``: the value must exceed the bound).

    Raises:
        ValueError: a bad combination of arguments (the message says which).
    """

    #: the engine's name in messages
    ENGINE: ClassVar[str] = 'inference'
    #: the server process ``launch`` builds
    PROCESS: ClassVar[type[ServerProcess]] = ServerProcess
    #: the keys ``launch`` takes
    LAUNCH_KEYS: ClassVar[frozenset[str]] = LAUNCH_KEYS
    #: the error this backend raises
    ERROR: ClassVar[type[ServerBackendError]] = ServerBackendError
    #: what each way of naming servers is, for the message when none or several are given
    SOURCES: ClassVar[dict[str, str]] = {
        'server_url': "running servers, e.g. 'http://127.0.0.1:8000'",
        'launch': 'dict(model_path=...) to start one'}
    #: whether a launched server is probed like a running one once it answered ``/health``
    CHECK_LAUNCHED: ClassVar[bool] = True
    #: the engine's endpoint that aborts every request a server runs (``None``: no abort,
    #: a :meth:`generate` on another thread runs to its end)
    ABORT_PATH: ClassVar[str | None] = None
    #: the JSON body of the :attr:`ABORT_PATH` request
    ABORT_BODY: ClassVar[dict[str, Any]] = {}
    #: whether the engine scores a given token sequence (:meth:`_score`), which turns on
    #: the push check
    SCORES_PROBE: ClassVar[bool] = False
    #: the engine's protocol errors a probe answer may raise (besides HTTP failures)
    PROTOCOL_ERRORS: ClassVar[tuple[type[Exception], ...]] = ()
    #: whether :meth:`attach` pushes the trainer's weights (servers given by address may
    #: hold anything); otherwise it records the servers' probe answers (they should hold
    #: the trainer's starting weights)
    PUSH_AT_ATTACH: ClassVar[bool] = False
    #: a ``GET`` endpoint that answers 200 with JSON on the engine's server: an address
    #: whose ``/health`` answers but this does not is something else (``None``: no check)
    IDENTITY_PATH: ClassVar[str | None] = None

    #: :meth:`generate` may run on several threads at once (``train_cfg.groups_in_flight``)
    concurrent_generate: ClassVar[bool] = True

    def __init__(self, server_url: str | Sequence[str] | None = None,
                 launch: dict | None = None, *, max_concurrency: int = 64,
                 timeout_s: float = 600.0, max_retries: int = 3, backoff_s: float = 1.0,
                 retry_after_s: float = 30.0, api_key: str | None = None,
                 weight_sync: dict | None = None, sources: dict[str, Any] | None = None,
                 numbers: dict[str, tuple[float, float, bool]] | None = None) -> None:
        urls = split_urls(server_url)
        given = [name for name, v in (('server_url', urls), *(sources or {}).items(),
                                      ('launch', launch)) if v]
        if len(given) != 1:
            options = [f'{name} ({why})' for name, why in self.SOURCES.items()]
            listed = ', '.join(options[:-1]) + f' or {options[-1]}'
            raise ValueError(f'{type(self).__name__} needs exactly one of {listed}; got '
                             f'{given or "none"}')
        for url in urls:
            if not url.startswith(('http://', 'https://')):
                raise ValueError(f'server_url must start with http:// or https://, got {url!r}')
        if launch is not None:
            if not isinstance(launch, dict):
                raise ValueError(f'launch must be a dict, got {type(launch).__name__}')
            unknown = set(launch) - self.LAUNCH_KEYS
            if unknown:
                raise ValueError(f'launch does not take {sorted(unknown)}; it takes '
                                 f'{sorted(self.LAUNCH_KEYS)}')
        bounds = {'max_concurrency': (max_concurrency, 1, False), 'timeout_s': (timeout_s, 0, True),
                  'max_retries': (max_retries, 0, False), 'backoff_s': (backoff_s, 0, False),
                  'retry_after_s': (retry_after_s, 0, False), **(numbers or {})}
        if any(v <= low if strict else v < low for v, low, strict in bounds.values()):
            need = ', '.join(f'{name} {">" if strict else ">="} {low}'
                             for name, (_, low, strict) in bounds.items())
            got = ', '.join(f'{v}' for v, _, _ in bounds.values())
            raise ValueError(f'need {need}; got {got}')
        self.server_urls = urls
        self.server = None if launch is None else self.PROCESS(**launch)
        self.max_concurrency = int(max_concurrency)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.retry_after_s = float(retry_after_s)
        self.api_key = api_key
        self.weight_sync = weight_sync
        self.tokenizer: Any = None
        self.num_updates = 0
        self._pool: ServerPool | None = None
        self._weight_dir = WeightDir(f'gepo_{self.ENGINE.lower()}_weights_')
        self._aborted = False
        self._hung: set[int] = set()  # servers whose last probe or push got no answer
        self.last_probe_diff: float | None = None  # the last push's largest probe gap
        self._probe_ids: list[int] | None = None
        self._probe_records: dict[int, ProbeRecord] = {}  # rank 0: server index -> record
        self._identity: dict[int, Any] = {}  # server index -> its IDENTITY_PATH answer
        self._epoch = 0  # preempt() calls so far: calls begun before the last one end early
        self._epoch_lock = threading.Lock()
        self._partial = False  # prepare_partial: a cut answer is a response so far

    # ------------------------------------------------------------- properties
    @property
    def url(self) -> str:
        """The servers' addresses (a launched server's once it started)."""
        if self.server is not None:
            return self.server.url
        return ', '.join(self._pool.urls if self._pool is not None else self.server_urls)

    @property
    def headers(self) -> dict[str, str] | None:
        """The headers of every request (the API key's)."""
        return None if self.api_key is None else {'Authorization': f'Bearer {self.api_key}'}

    @property
    def request_timeout_s(self) -> float:
        """How long the client waits for one answer (``timeout_s`` unless an engine
        knows better, e.g. of its servers' queues)."""
        return self.timeout_s

    @property
    def syncs_weights(self) -> bool:
        """Whether the servers must hold the trainer's weights (a weight-sync mode that
        pushes): a server that missed a push stays out until it got the next one."""
        return (self.weight_sync or {}).get('mode') not in (None, 'none')

    @property
    def probe_tolerance(self) -> float | None:
        """The largest gap between a server's and the trainer's logprobs of the probe
        after a push (``weight_sync.probe_tolerance``, default
        :data:`~gepo_xtuner.rollout.server.probe.DEFAULT_TOLERANCE`); ``None`` when there
        is no check: switched off (``probe_tolerance=None``), an engine that cannot score a
        sequence, or weights that are never pushed."""
        if not (self.SCORES_PROBE and self.syncs_weights):
            return None
        return self.weight_sync.get('probe_tolerance', DEFAULT_TOLERANCE)

    @property
    def _http(self) -> HTTPPool:
        """The connection pool of the first server (the single-server modes' server)."""
        return self._pool.servers[0].http

    def start_hint(self) -> str:
        """A command that starts a server this backend can use (for messages)."""
        return f'{self.ENGINE} server MODEL'

    # ----------------------------------------------------------------- lifecycle
    def attach(self, model: nn.Module, tokenizer: Any) -> None:
        """Keeps the tokenizer (saved with the weight files) and reaches the servers; a
        launched server trusts remote code when the trainer's policy runs some. Every
        rank calls it."""
        self.tokenizer = tokenizer
        if self.server is not None and self.server.trust_remote_code is None:
            self.server.trust_remote_code = runs_remote_code(model)  # the trainer's checkpoint
        self._ensure_server()
        if model is None or not self.syncs_weights:
            return
        if self.PUSH_AT_ATTACH:
            self._refuse_sharded(model)
            self._sync(model, self._pool.version, count=False)
        elif self.probe_tolerance is not None:
            self._refuse_sharded(model)
            self._on_rank0(lambda: self._record_probes(model))

    def _ensure_server(self) -> None:
        """Launches (rank 0) or checks the servers once; every rank calls it at the same
        point.

        Raises:
            ValueError: ``launch.port=0`` with several processes.
            ServerBackendError: the backend was aborted, or no server is ready (the
                message names each one and what to do).
        """
        if self._aborted:
            raise self.ERROR(f'this {type(self).__name__} was aborted (its step failed); '
                             'build a new one to generate again')
        if self._pool is not None:
            return
        if self.server is not None:
            if self.server.port == 0 and dist_world_size() > 1:
                raise ValueError('launch.port=0 (any free port) works in one process only; set '
                                 'a fixed launch.port for multi-process training')
            self._on_rank0(self.server.start)
        pool = ServerPool(self._server_urls(), self.max_concurrency, self.request_timeout_s,
                          self.max_retries, self.backoff_s, self.headers, self.retry_after_s,
                          track_weights=self.syncs_weights)
        for s in pool.servers:  # all start on the weights the trainer starts from
            pool.mark_synced(s, pool.version)
        if self.server is None or self.CHECK_LAUNCHED:
            for s in pool.servers:
                ok, why = self._check_server(s)
                self._note_answer(s.index, why)
                if not ok:
                    pool.mark_out(s, why)
            if not pool.ready_servers():
                pool.close()
                raise self.ERROR(self._no_server_message(pool))
        self._on_pool(pool)
        self._pool = pool

    def _server_urls(self) -> list[str]:
        """Where the servers are, on every rank (a launched server's address, or
        ``server_url``); engines with other ways to find servers override it."""
        return [self.server.url] if self.server is not None else list(self.server_urls)

    def _check_server(self, server: Server) -> tuple[bool, str]:
        """Whether a running server can take this backend's requests; and why not
        (default: ``GET /health`` answers 200, the engine is awake and the address is the
        engine's, :meth:`_check_identity`)."""
        timeout = min(self.timeout_s, PROBE_TIMEOUT_S)
        ok, why = is_ready(server.http, timeout)
        if not ok:
            return False, why + self._not_engine_hint(why)
        return self._check_identity(server, timeout)

    def _not_engine_hint(self, why: str) -> str:
        """Where ``/health`` got an answer that no engine gives (404: no such route),
        a hint that the address may be something else's."""
        if 'HTTP 404' not in why:
            return ''
        return (f' (something answers there, but has no /health route: is '
                f"{self._address_setting()} the {self.ENGINE} server's address?)")

    def _address_setting(self) -> str:
        """The setting that named the servers, for messages."""
        return 'launch' if self.server is not None else 'server_url'

    def _check_identity(self, server: Server, timeout_s: float) -> tuple[bool, str]:
        """Whether ``GET IDENTITY_PATH`` answers 200 with JSON (``(True, '')`` without an
        :attr:`IDENTITY_PATH`): an address where ``/health`` answers may still be another
        service, whose requests would fail only later and less clearly."""
        if self.IDENTITY_PATH is None:
            return True, ''
        try:
            body = server.http.request('GET', self.IDENTITY_PATH, retries=0, timeout_s=timeout_s)
        except ServerRequestError as e:
            if e.status is None:  # no answer at all: not a question of identity
                return False, str(e)
            failure = f'HTTP {e.status}'
        else:
            if isinstance(body, dict | list):
                self._identity[server.index] = body
                return True, ''
            failure = f'no JSON but {str(body)[:80]!r}'
        return False, (f'{server.url}/health answered 200 but {self.IDENTITY_PATH} did not '
                       f'({failure}): is {self._address_setting()} the {self.ENGINE} server\'s '
                       'address, and not another service on that port?')

    def _on_pool(self, pool: ServerPool) -> None:
        """Called once the servers are reached, before the first request (nothing by
        default; e.g. the served model's name)."""

    def _no_server_message(self, pool: ServerPool) -> str:
        asleep = any(ASLEEP in s.reason for s in pool.servers)
        if any('HTTP 401' in s.reason for s in pool.servers):
            todo = '\nThe server wants an API key: set api_key to one of its --api-keys'
        elif asleep:
            todo = '\n' + self._asleep_hint()
        else:
            fix = ' / '.join(name for name in self.SOURCES if name != 'launch')
            todo = f'\nStart one, e.g. `{self.start_hint()}`, or fix {fix}'
        return pool.describe_out(
            f'no {"awake" if asleep else "healthy"} {self.ENGINE} server at {self.url}') + todo

    def _asleep_hint(self) -> str:
        """What to do about servers that sleep (the engine knows how to wake them)."""
        return 'A sleeping server has to be woken (the engine\'s wake-up call) first'

    def close(self) -> None:
        """Closes connections, stops a launched server and removes the default weight
        directory."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self.server is not None:
            self.server.close()
        self._weight_dir.remove()

    def pop_metrics(self) -> dict[str, float]:
        """Per-server figures since the last call (``rollout/server/<i>/...``, see
        :meth:`~gepo_xtuner.rollout.server.pool.ServerPool.pop_metrics`), and
        ``rollout/probe_abs_diff`` (the last push's largest probe gap over the servers
        that took it, when the push check is on)."""
        out = {} if self._pool is None else self._pool.pop_metrics()
        if self.last_probe_diff is not None:
            out['rollout/probe_abs_diff'] = self.last_probe_diff
            self.last_probe_diff = None
        return out

    def logprob_temperature(self, params: Any) -> float:
        """1: the servers report ``log_softmax`` of the raw logits, before the sampling
        temperature (an engine that reports tempered logprobs overrides this)."""
        return 1.0

    def state_dict(self) -> dict[str, Any]:
        """The weight-update counter (it numbers the weight files)."""
        return {'num_updates': self.num_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.num_updates = int(state.get('num_updates', self.num_updates))

    # ---------------------------------------------------------- distributed
    def _on_rank0(self, fn: Callable[[], T]) -> T:
        """:func:`on_rank0` with this engine's error."""
        return on_rank0(fn, self.ERROR)

    # ---------------------------------------------------------------- requests
    def _map(self, fn: Callable[[HTTPPool, T], Any], items: Sequence[T],
             size: Callable[[Any], int] | None = None, path: str = '',
             protocol_errors: tuple[type[Exception], ...] = ()) -> list[Any]:
        """``fn(http, item)`` for every item over the ready servers (see
        :meth:`ServerPool.map <gepo_xtuner.rollout.server.pool.ServerPool.map>`), with
        failures as this engine's error.

        Raises:
            ServerBackendError: a request failed for good, no server is left, an answer
                broke the engine's protocol (``protocol_errors``, naming ``path``), or the
                backend was aborted meanwhile.
        """
        if self._aborted:  # abort() came while the servers were being reached
            raise self.ERROR(f'generation aborted ({type(self).__name__}.abort) before any '
                             'request was sent')
        try:
            return self._pool.map(fn, items, size=size)
        except Exception as e:
            if self._aborted:  # whatever the cancelled requests raised
                raise self.ERROR(f'generation aborted ({type(self).__name__}.abort): {e}') \
                    from e
            if isinstance(e, ServerRequestError):
                raise self.ERROR(self._explain(e)) from e
            if isinstance(e, NoServerError):
                raise self.ERROR(f'{e}\nCheck that the servers run and that this machine '
                                 'reaches them (curl URL/health).') from e
            if protocol_errors and isinstance(e, protocol_errors):
                raise self.ERROR(f'{self.ENGINE} server {self.url}, {path}: {e}') from e
            raise

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request to the first server, its failure as this engine's error."""
        try:
            return self._http.request(method, path, **kwargs)
        except ServerRequestError as e:
            raise self.ERROR(self._explain(e)) from e

    def _explain(self, e: ServerRequestError) -> str:
        """The error, the engine's advice, and where to look."""
        parts = [f'{self.ENGINE} server {self.url}: {e}', *self._hints(e)]
        if self.server is not None:
            parts.append(f'Server log {self.server.log_file} ends with:\n{self.server.log_tail()}')
        elif e.status is None:
            parts.append(f'Check that the server runs and that this machine reaches it '
                         f'(curl {e.url or self.url}/health).')
        if self._pool is not None and len(self._pool.servers) > 1:
            parts.append(self._pool.describe_out('Servers'))
        return '\n'.join(parts)

    def _hints(self, e: ServerRequestError) -> list[str]:
        """The engine's advice on ``e`` (none by default)."""
        return []

    # ------------------------------------------------------------- weight sync
    def update_weights(self, model: nn.Module) -> None:
        """Makes every ready server sample from ``model``'s current weights.

        Only global rank 0 talks to the servers; every rank calls this and waits until
        rank 0 has pushed (:meth:`_push_weights`). Servers that were out and answer
        healthy again get the weights and rejoin; a server the push fails on is taken
        out, on every rank. ``model`` must hold full (unsharded) parameters on rank 0.

        Raises:
            ServerBackendError: no ``weight_sync`` configured, a sharded policy, or no
                server took the weights.
        """
        if self.weight_sync is None:
            raise self.ERROR(
                f'{type(self).__name__}.update_weights: no weight_sync configured, so the '
                'servers would keep sampling from their initial weights; set weight_sync='
                f'dict(mode=...) for training ({self._weight_sync_modes()}), or '
                "dict(mode='none') for servers whose weights never change")
        if self.weight_sync['mode'] == 'none':
            return
        self._refuse_sharded(model)
        self._ensure_server()
        self._sync(model, self._pool.version + 1, count=True)

    def _weight_sync_modes(self) -> str:
        """The pushing modes, for messages."""
        return 'see the backend\'s weight_sync'

    def _refuse_sharded(self, model: nn.Module) -> None:
        """Raises where ``model`` is partitioned by DeepSpeed ZeRO-3 (checked on every
        rank, so none waits for a push that never comes)."""
        if any(hasattr(p, 'ds_id') for p in model.parameters()):
            raise self.ERROR(
                'the policy is partitioned by DeepSpeed ZeRO-3: each rank holds a shard of '
                f'every parameter, and pushing shards to {self.ENGINE} servers is not '
                'supported; train with ZeRO-2 (full parameters on every rank) or DDP, see '
                'docs/cluster.md')

    def _sync(self, model: nn.Module, version: int, count: bool) -> dict:
        """Every rank: waits for all ranks (none is still generating: another rank's
        requests must not meet the new weights), then rank 0 pushes ``model`` as weights
        ``version`` and every rank learns which servers took them.

        Returns:
            rank 0's report (see :meth:`_push_weights`).
        """
        barrier()
        pool = self._pool
        report = self._on_rank0(lambda: self._checked_push(model, version))
        for url in report.get('urls', pool.urls)[len(pool.servers):]:
            pool.add(url)
        pool.version = version
        for i, s in enumerate(pool.servers):
            if i in report['synced']:
                pool.mark_synced(s, report['synced'][i])
                self._note_answer(i, '')
            else:
                why = report['out'].get(i, s.reason or 'missed a weight sync')
                pool.mark_out(s, why)
                self._note_answer(i, why)
        if count:
            self.num_updates += 1
        self.last_probe_diff = report.get('probe')
        if not pool.ready_servers():
            raise self.ERROR(pool.describe_out(
                f'weight sync {version} reached no {self.ENGINE} server'))
        return report

    def _checked_push(self, model: nn.Module, version: int) -> dict:
        """Rank 0: :meth:`_push_weights`, then, with the push check on, the probe of
        every server that took the weights: one that fails it is reported out, with why
        (it gets the weights again at the next push, as any server that missed one).

        Returns:
            the push's report, with ``probe`` (the largest gap over the servers that
            passed; ``None`` without the check).
        """
        tolerance = self.probe_tolerance
        expected = None if tolerance is None else self._trainer_probe(model)
        report = self._push_weights(model, version)
        if expected is None:
            return report
        worst, servers = None, self._pool.servers
        for index in sorted(report['synced']):
            # a server the push added (address files) has no Server here yet
            http = servers[index].http if index < len(servers) else HTTPPool(
                report['urls'][index], 1, self.timeout_s, 0, self.backoff_s, self.headers)
            why, gap = self._verify(index, http, expected, tolerance, version)
            if index >= len(servers):
                http.close()
            if why is not None:
                del report['synced'][index]
                report['out'][index] = why
                continue
            worst = gap if worst is None else max(worst, gap)
        report['probe'] = worst
        return report

    def _verify(self, index: int, http: HTTPPool, expected: list[float], tolerance: float,
                version: int) -> tuple[str | None, float]:
        """Rank 0: one server's probe after push ``version``: why it failed (``None``:
        it passed), and its gap."""
        try:
            got = self._score(http, self._probe_ids, self.timeout_s)
        except (ServerRequestError, *self.PROTOCOL_ERRORS) as e:
            self._probe_records.pop(index, None)
            return (f'weight push {version}: the probe of the push check failed: '
                    f'{e}{self._probe_refused_hint(e)}', math.nan)
        why, gap, record = judge(got, expected, self._probe_records.get(index), tolerance,
                                 version)
        if record is None:
            self._probe_records.pop(index, None)
        else:
            self._probe_records[index] = record
        if why is not None:
            why = (f'{self.ENGINE} server {http.base_url}: after weight push {version} {why} '
                   '(weight_sync.probe_tolerance; see the engine\'s doc)')
        return why, gap

    def _probe_refused_hint(self, e: Exception) -> str:
        """What to do when a server cannot answer the probe."""
        if isinstance(e, ServerRequestError) and e.status is not None and 400 <= e.status < 500:
            return (f' (the server refused to score the probe sequence; nothing else checks '
                    f'that a push reached this {self.ENGINE} server: set weight_sync.'
                    'probe_tolerance=None to push without the check)')
        return ''

    def _record_probes(self, model: nn.Module) -> None:
        """Rank 0, at attach: every ready server's probe answer for the trainer's starting
        weights, which the first push's check compares with. A server that differs by more
        than the tolerance (it may hold other weights) or cannot answer is warned about:
        the first push checks it anyway."""
        expected = self._trainer_probe(model)
        tolerance = self.probe_tolerance
        if expected is None:
            return
        for s in self._pool.ready_servers():
            try:
                got = self._score(s.http, self._probe_ids, min(self.timeout_s, PROBE_TIMEOUT_S))
            except (ServerRequestError, *self.PROTOCOL_ERRORS) as e:
                print_log(f'{self.ENGINE} server {s.url}: the probe of the push check failed at '
                          f'attach: {e}{self._probe_refused_hint(e)}', logger='current',
                          level=logging.WARNING)
                continue
            gap = max_abs_diff(got, expected)
            if len(got) != len(expected) or not gap <= tolerance:
                print_log(f"{self.ENGINE} server {s.url}: its logprobs of the probe differ from "
                          f"the trainer's starting weights by up to {gap:.3g} (weight_sync."
                          f'probe_tolerance={tolerance:g}): it may hold other weights until the '
                          'first push', logger='current', level=logging.WARNING)
                continue
            self._probe_records[s.index] = ProbeRecord(expected, got, self._pool.version)

    def _trainer_probe(self, model: nn.Module) -> list[float] | None:
        """Rank 0: the trainer's logprobs of the probe sequence (built on first use from
        the model's vocabulary size); ``None`` for a model without ``config.vocab_size``
        (not a language model the servers could run, e.g. a test's stand-in module)."""
        vocab = vocab_size(model)
        if vocab is None:
            return None
        if self._probe_ids is None:
            self._probe_ids = probe_ids(vocab)
        return trainer_logprobs(model, self._probe_ids)

    def _score(self, http: HTTPPool, ids: Sequence[int], timeout_s: float) -> list[float]:
        """``log p(ids[t] | ids[:t])``, ``t >= 1``, under the server's current weights (an
        engine with :attr:`SCORES_PROBE` implements it: one short request).

        Raises:
            ServerRequestError: the request failed.
        """
        raise NotImplementedError(f'{type(self).__name__} scores no probe')

    def _push_weights(self, model: nn.Module, version: int) -> dict:
        """Rank 0: ``model``'s weights as ``version`` into every server that is up.

        Returns:
            ``synced`` (server index -> version pushed), ``out`` (index -> why not) and
            optionally ``urls`` (the pool's servers, new ones last) and engine figures.
        """
        raise NotImplementedError(f'{type(self).__name__} pushes no weights')

    def _servers_to_push(self) -> list[tuple[Server, str | None]]:
        """Rank 0: every server, and why it cannot take weights now (None: it can): a
        server that is out (or new) gets weights only once it answers healthy
        (:meth:`_probe`)."""
        out = []
        for s in self._pool.servers:
            why = None
            if not s.ready:
                ok, reason = self._probe(s)
                why = None if ok else reason
            out.append((s, why))
        return out

    def _probe(self, server: Server) -> tuple[bool, str]:
        """Rank 0: whether an out server is ready again; and why not.

        A server that gave no answer last time (hung: it takes connections and answers
        nothing) is given :data:`HUNG_PROBE_S`, not the full probe time: it cost one
        bounded wait already, and a server that is back answers ``/health`` at once.
        """
        hung = server.index in self._hung
        timeout = min(self.timeout_s, HUNG_PROBE_S if hung else PROBE_TIMEOUT_S)
        ok, why = is_ready(server.http, timeout)
        self._note_answer(server.index, why)
        if hung and not ok and _NO_ANSWER in why:
            why += ' (it gave no answer before either: still hung)'
        return ok, why

    def _note_answer(self, index: int, why: str) -> None:
        """Remembers whether server ``index`` answered (``why`` of its last failure;
        ``''``: it answered)."""
        if _NO_ANSWER in why:
            self._hung.add(index)
        else:
            self._hung.discard(index)

    def _save_weight_files(self, model: nn.Module, step: int, shared_dir: str | None = None,
                           keep: int = 2, base_model: str | None = None) -> Path:
        """Rank 0: ``model`` (and the tokenizer) as a checkpoint directory
        ``step_{step}`` under ``shared_dir`` (default: a directory of this backend, see
        :class:`~gepo_xtuner.rollout.server.weights.WeightDir`)."""
        shared = shared_dir or self._weight_dir.path(model, keep)
        return save_weights(model, self.tokenizer, shared, step, base_model=base_model,
                            keep=keep)

    def _paused(self, server: Server, work: Callable[[], T], timeout_s: float) -> T:
        """``work()`` while ``server`` is paused (:meth:`_pause`, :meth:`_resume`).

        The server is resumed whatever failed (also a pause that timed out after it took
        effect), within :data:`RESUME_AFTER_FAILURE_S`; an error of that resume does not
        hide the first one.
        """
        http = server.http
        try:
            self._pause(http, timeout_s)
            result = work()
        except ServerRequestError:
            try:
                self._resume(http, min(timeout_s, RESUME_AFTER_FAILURE_S), retries=0)
            except ServerRequestError:
                pass
            raise
        self._resume(http, timeout_s)
        return result

    def _pause(self, http: HTTPPool, timeout_s: float) -> None:
        """Stops the server taking new requests and waits for those in flight (nothing
        by default)."""

    def _resume(self, http: HTTPPool, timeout_s: float, retries: int | None = None) -> None:
        """Undoes :meth:`_pause` (nothing by default)."""

    # ------------------------------------------------------------------- abort
    def abort(self) -> None:
        """Cancels the requests in flight and returns once none is left (engines with an
        :attr:`ABORT_PATH`; others run to their end, as :class:`RolloutBackend`'s).

        Nothing more is sent (:meth:`ServerPool.abort
        <gepo_xtuner.rollout.server.pool.ServerPool.abort>`) and each server that runs
        requests of this backend aborts every request it runs (``POST ABORT_PATH``; on a
        server other trainer ranks share, their requests too, which is what a failed
        step wants). A request still on its way when that call reached the server would
        run to its end, so the call is sent again, after 0.05 s, then 0.1 s, ... up to
        every second (:data:`ABORT_RESEND_S`), to the servers that still run requests
        of this backend, until none is in flight or ``timeout_s`` passed. A server that
        refuses the call is warned about once and not asked again: its requests run to
        their end, and this call waits for them (at most ``timeout_s``). A
        :meth:`generate` running on another thread then raises; later calls raise too.
        With nothing in flight, no server is contacted."""
        if self.ABORT_PATH is None:
            return
        self._aborted = True
        pool = self._pool
        if pool is None:
            return
        pool.abort()
        self._end_in_flight(pool)

    def _end_in_flight(self, pool: ServerPool) -> None:
        """Sends :attr:`ABORT_PATH` to the servers that run requests of this backend
        until none is in flight (at most ``timeout_s``): :meth:`abort`'s loop, which
        :meth:`preempt` shares."""
        deadline = time.monotonic() + self.timeout_s
        wait, longest = ABORT_RESEND_S
        refused: set[int] = set()
        while True:
            for s in pool.busy_servers():
                left = deadline - time.monotonic()
                if s.index in refused or left <= 0:
                    continue
                try:
                    # a plain client: the pool's connections are being cancelled
                    resp = httpx.post(f'{s.url}{self.ABORT_PATH}', json=self.ABORT_BODY,
                                      headers=self.headers, timeout=min(10.0, left))
                except httpx.HTTPError:
                    continue  # a dead server runs nothing; its requests fail on their own
                if not resp.is_success:
                    refused.add(s.index)
                    print_log(f'{self.ENGINE} server {s.url}: POST {self.ABORT_PATH} answered '
                              f'HTTP {resp.status_code}; its requests in flight run to their '
                              f'end{self._abort_refused_hint()}', logger='current',
                              level=logging.WARNING)
            if pool.wait_idle(max(0.0, min(wait, deadline - time.monotonic()))):
                return
            if time.monotonic() >= deadline:
                print_log(f'{type(self).__name__}.abort: requests still in flight after '
                          f'timeout_s={self.timeout_s:g} s; the generating thread ends when '
                          'they fail or time out', logger='current', level=logging.WARNING)
                return
            wait = min(2 * wait, longest)

    def prepare_partial(self) -> None:
        """From now on an answer that :meth:`preempt` cut is a response so far, not an
        error (an engine that must stream for it to keep its tokens streams)."""
        super().prepare_partial()
        self._partial = True

    def preempt(self) -> None:
        """Ends the requests in flight of the :meth:`generate` calls begun before it: their
        items not yet sent come back empty, and :meth:`_end_in_flight` makes the servers
        end those on the wire, which answer with their tokens so far (an engine that
        supports this streams its answers after :meth:`prepare_partial` and parses
        ``'abort'`` answers as partial). Returns once none of them runs."""
        if self.partial_refusal() is not None:
            raise NotImplementedError(self.partial_refusal())
        with self._epoch_lock:
            self._epoch += 1
        if self._pool is not None:
            self._end_in_flight(self._pool)

    def request_slots(self) -> int:
        """``max_concurrency`` requests on each server, over the servers the backend holds
        once it reached them, else over those named (one for a launched server)."""
        servers = (len(self._pool.servers) if self._pool is not None
                   else max(len(self.server_urls), 1))
        return self.max_concurrency * servers

    def _abort_refused_hint(self) -> str:
        """What to change when a server refuses :attr:`ABORT_PATH` (appended to the
        warning)."""
        return ''


__all__ = ['ABORT_RESEND_S', 'ServerBackendError', 'ServerRolloutBackend', 'barrier',
           'broadcast', 'on_rank0', 'split_urls']
