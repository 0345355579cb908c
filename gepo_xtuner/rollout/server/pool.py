"""Requests spread over several inference servers, with failover and rejoin.

A :class:`ServerPool` holds one :class:`~gepo_xtuner.rollout.server.http.HTTPPool` per
server and sends each item of :meth:`ServerPool.map` to the ready server with the
fewest requests outstanding (at most ``max_concurrency`` each), so no server waits
while another has a queue. A server whose request fails for good (connection lost,
no answer within ``timeout_s``, 5xx after its retries) is taken out, and every
request it still held is sent once more, to another server; each item yields
exactly one result, in input order. A 4xx answer is the request's fault, not the
server's: it ends the call at once.

A server that was taken out is probed again (``GET /health``) every
``retry_after_s``. Servers whose weights follow the trainer (``track_weights``) may
have restarted on their initial weights, so they rejoin only once they have the
current weights again (:meth:`ServerPool.mark_synced`, called after a weight push);
the others rejoin as soon as they answer healthy. A server whose engine is asleep
(``GET /is_sleeping``, live; LMDeploy's ``/health`` lags by up to 12 s) is not ready.
"""

import collections
import concurrent.futures as cf
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mmengine.logging import print_log

from .http import HTTPPool, ServerRequestError

T = TypeVar('T')
_NEW = 'not checked yet'  # the reason of a server added and not yet probed or synced


class NoServerError(RuntimeError):
    """Every server of the pool is out; the message lists why each one left."""


class PoolAbortedError(RuntimeError):
    """The pool was aborted (:meth:`ServerPool.abort`) while a call was running."""


@dataclass
class Server:
    """One server of a pool and its bookkeeping.

    Attributes:
        index: position in the pool (the ``<i>`` of ``rollout/server/<i>/...``).
        http: the connection pool to it.
        ready: takes requests now.
        version: the weights version it holds (see :attr:`ServerPool.version`); ``-1``
            when unknown (it was out, so it may have restarted).
        reason: why it was taken out last (``''`` if never).
        next_probe: ``time.monotonic()`` after which an out server is probed again.
        outstanding: requests sent to it and not answered yet.
        stats: counters since the last :meth:`ServerPool.pop_metrics`.
    """

    index: int
    http: HTTPPool
    ready: bool = True
    version: int = 0
    reason: str = ''
    next_probe: float = 0.0
    outstanding: int = 0
    stats: collections.Counter = field(default_factory=collections.Counter)

    @property
    def url(self) -> str:
        return self.http.base_url


ASLEEP = 'engine asleep'  # in the reason of a server that is out because it sleeps


def is_asleep(http: HTTPPool, timeout_s: float = 10.0, health: Any = None) -> bool:
    """The engine's live sleep state (``GET /is_sleeping``).

    ``/health`` is no substitute: LMDeploy answers it from a snapshot its health
    monitor refreshes every 12 s, so for up to 12 s after ``POST /sleep`` it still
    says ``healthy``. A server without ``/is_sleeping`` is judged by ``health``
    (its ``/health`` body) instead.

    Raises:
        ServerRequestError: the server did not answer.
    """
    try:
        body = http.request('GET', '/is_sleeping', retries=0, timeout_s=timeout_s)
    except ServerRequestError as e:
        if e.status != 404:
            raise
        return isinstance(health, dict) and health.get('status') == 'sleeping'
    return bool(isinstance(body, dict) and body.get('is_sleeping'))


def is_ready(http: HTTPPool, timeout_s: float = 10.0) -> tuple[bool, str]:
    """Whether ``GET /health`` answers 200 and the engine is awake now; and why not."""
    try:
        health = http.request('GET', '/health', retries=0, timeout_s=timeout_s)
        if is_asleep(http, timeout_s, health):
            return False, f'{http.base_url}/is_sleeping answers true ({ASLEEP})'
    except ServerRequestError as e:
        return False, str(e)
    return True, ''


class ServerPool:
    """Items of a call spread over servers by outstanding requests, with failover.

    Args:
        urls: the servers' base addresses.
        max_concurrency: requests in flight per server at most.
        timeout_s, max_retries, backoff_s, headers: per server, as
            :class:`~gepo_xtuner.rollout.server.http.HTTPPool` (retries stay on the
            same server; the pool fails over only once they are spent).
        retry_after_s: how long an out server stays out before it is probed again.
        track_weights: servers must hold the trainer's weights (see module doc).
    """

    def __init__(self, urls: Sequence[str], max_concurrency: int = 64,
                 timeout_s: float = 600.0, max_retries: int = 3, backoff_s: float = 1.0,
                 headers: dict[str, str] | None = None, retry_after_s: float = 30.0,
                 track_weights: bool = False) -> None:
        if not urls:
            raise ValueError('a server pool needs at least one server URL')
        self._http_args = (max_concurrency, timeout_s, max_retries, backoff_s, headers)
        self.max_concurrency = int(max_concurrency)
        self.retry_after_s = float(retry_after_s)
        self.track_weights = bool(track_weights)
        self.version = 0
        self.resent = 0
        self.servers: list[Server] = []
        self._cond = threading.Condition()
        self._executors: dict[int, cf.ThreadPoolExecutor] = {}
        self._aborted = False
        for url in urls:
            self.add(url)

    def add(self, url: str) -> Server:
        """Adds a server (not ready until probed or synced); returns it."""
        with self._cond:
            server = Server(len(self.servers), HTTPPool(url, *self._http_args), ready=False,
                            version=-1 if self.track_weights else self.version,
                            reason=_NEW)
            self.servers.append(server)
        return server

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def ready_servers(self) -> list[Server]:
        return [s for s in self.servers if s.ready]

    # ---------------------------------------------------------------- membership
    def mark_out(self, server: Server, reason: str) -> None:
        """Takes ``server`` out until it is probed (or synced) back in."""
        with self._cond:
            if server.ready:
                server.stats['taken_out'] += 1
                print_log(f'rollout server {server.index} ({server.url}) taken out: {reason}',
                          logger='current', level=logging.WARNING)
            server.ready, server.reason = False, reason
            server.next_probe = time.monotonic() + self.retry_after_s
            if self.track_weights:
                server.version = -1
            self._cond.notify_all()

    def mark_synced(self, server: Server, version: int) -> None:
        """Records that ``server`` now holds weights ``version`` (and is up)."""
        with self._cond:
            back = not server.ready and server.reason != _NEW
            server.version = version
            server.ready, server.reason = version == self.version, ''
            if back and server.ready:
                self._rejoined(server)
            self._cond.notify_all()

    def probe(self, servers: Sequence[Server] | None = None, force: bool = False) -> None:
        """Probes out servers that are due (all of them with ``force``); healthy ones
        whose weights are current come back in."""
        now = time.monotonic()
        for s in self.servers if servers is None else servers:
            if s.ready or (not force and now < s.next_probe):
                continue
            ok, why = is_ready(s.http)
            if not ok:
                self.mark_out(s, why)
            elif s.version == self.version:
                with self._cond:
                    s.ready, s.reason = True, ''
                    self._rejoined(s)
                    self._cond.notify_all()
            else:
                s.reason = 'healthy, waiting for the current weights'
                s.next_probe = now + self.retry_after_s

    @staticmethod
    def _rejoined(server: Server) -> None:
        server.stats['rejoined'] += 1
        print_log(f'rollout server {server.index} ({server.url}) is back', logger='current',
                  level=logging.WARNING)

    # ---------------------------------------------------------------------- map
    def map(self, fn: Callable[[HTTPPool, T], Any], items: Sequence[T],
            size: Callable[[Any], int] | None = None) -> list[Any]:
        """``[fn(http, x) for x in items]``, each on some ready server, in input order.

        ``fn`` makes the item's request through ``http`` (the chosen server's pool)
        and raises :class:`ServerRequestError` when it failed. ``size(result)`` (e.g.
        the tokens generated) feeds the per-server throughput metric.

        Several threads may call it at once: together they keep at most
        ``max_concurrency`` requests on each server, and a call that finds every ready
        server's slots taken by the others waits for one.

        Raises:
            ServerRequestError: a 4xx answer (the request is at fault), the last
                server failed and no other was ready, or one request failed
                ``2 * len(servers)`` times.
            NoServerError: no server is ready at the start.
            Exception: whatever else ``fn`` raised (e.g. a malformed answer).
        """
        self.probe()
        if not items:
            return []
        if not self.ready_servers():
            raise NoServerError(self.describe_out('no rollout server is ready'))
        n = len(items)
        results: list[Any] = [None] * n
        tried: list[set[int]] = [set() for _ in range(n)]
        failed = [0] * n
        queue = collections.deque(range(n))
        state = {'in_flight': 0, 'error': None, 'last_failure': None}
        start = time.monotonic()

        def attempt(server: Server, i: int) -> None:
            t0 = time.monotonic()
            try:
                if self._aborted:  # queued on the thread pool before the abort
                    raise PoolAbortedError('not sent: the server pool was aborted')
                out = fn(server.http, items[i])
            except ServerRequestError as e:
                with self._cond:
                    server.outstanding -= 1
                    state['in_flight'] -= 1
                    if self._aborted:  # what the abort cut short: no failure of the server
                        self._cond.notify_all()
                        return
                    server.stats['failures'] += 1
                    if e.status is not None and 400 <= e.status < 500:
                        state['error'] = state['error'] or e
                    elif failed[i] + 1 >= 2 * len(self.servers):  # it fails everywhere
                        state['error'] = state['error'] or e
                    else:
                        failed[i] += 1
                        tried[i].add(server.index)
                        state['last_failure'] = e
                        queue.appendleft(i)  # sent once more, to the next ready server
                        self.resent += 1
                        server.stats['resent'] += 1
                    self._cond.notify_all()
                if (e.status is None or e.status >= 500) and not self._aborted:
                    self.mark_out(server, str(e))
                return
            except BaseException as e:  # noqa: BLE001 (handed to the caller)
                with self._cond:
                    server.outstanding -= 1
                    state['in_flight'] -= 1
                    state['error'] = state['error'] or e
                    self._cond.notify_all()
                return
            with self._cond:
                server.outstanding -= 1
                state['in_flight'] -= 1
                results[i] = out
                server.stats['requests'] += 1
                server.stats['busy_s'] += time.monotonic() - t0
                if size is not None:
                    server.stats['tokens'] += size(out)
                self._cond.notify_all()

        with self._cond:
            while True:
                if self._aborted:
                    state['error'] = state['error'] or PoolAbortedError(
                        f'the server pool was aborted with {len(queue)} of {n} requests unsent')
                if state['error'] is not None:
                    break
                if not queue:
                    if state['in_flight'] == 0:
                        break
                    self._cond.wait()
                    continue
                server = self._least_loaded(tried[queue[0]])
                if server is None and state['in_flight'] == 0:
                    self.probe()  # nothing of this call runs: every server out? any back?
                    server = self._least_loaded(tried[queue[0]])
                    if server is None and not self.ready_servers():
                        state['error'] = state['last_failure'] or NoServerError(
                            self.describe_out('no rollout server is ready'))
                        continue
                if server is None:
                    self._cond.wait()
                    continue
                i = queue.popleft()
                server.outstanding += 1
                server.stats['max_outstanding'] = max(server.stats['max_outstanding'],
                                                      server.outstanding)
                state['in_flight'] += 1
                self._executor(server).submit(attempt, server, i)
            while state['in_flight']:  # let the others finish before raising
                self._cond.wait()
        for s in self.servers:
            s.stats['wall_s'] += time.monotonic() - start
        if state['error'] is not None:
            if self._aborted and not isinstance(state['error'], PoolAbortedError):
                # e.g. an answer the abort cut short failed to parse first
                raise PoolAbortedError('the server pool was aborted during the call') \
                    from state['error']
            raise state['error']
        return results

    def _least_loaded(self, exclude: set[int]) -> Server | None:
        """The ready server with the fewest outstanding requests below the cap.

        A server that already failed this request is skipped while another is ready.
        """
        ready = [s for s in self.servers if s.ready and s.outstanding < self.max_concurrency]
        fresh = [s for s in ready if s.index not in exclude]
        if not fresh and any(s.ready and s.index not in exclude for s in self.servers):
            return None  # one that has not tried it will free up
        candidates = fresh or ready
        return min(candidates, key=lambda s: (s.outstanding, s.index), default=None)

    def _executor(self, server: Server) -> cf.ThreadPoolExecutor:
        ex = self._executors.get(server.index)
        if ex is None:
            ex = self._executors[server.index] = cf.ThreadPoolExecutor(
                self.max_concurrency, thread_name_prefix=f'rollout-server-{server.index}')
        return ex

    # ------------------------------------------------------------------ reports
    def describe_out(self, headline: str) -> str:
        """``headline`` plus each server's state and last failure."""
        lines = [f'{headline}:']
        for s in self.servers:
            state = 'ready' if s.ready else f'out: {s.reason}'
            lines.append(f'  [{s.index}] {s.url}: {state}')
        return '\n'.join(lines)

    def pop_metrics(self) -> dict[str, float]:
        """Per-server figures since the last call, then resets them.

        ``rollout/server/<i>/requests`` (answered), ``failures`` (failed attempts),
        ``resent`` (requests it lost that went to another server), ``taken_out``,
        ``rejoined``,
        ``tokens_per_sec`` (``size`` of its answers over the wall time of the calls),
        ``max_outstanding`` and ``ready`` (1 or 0, now); ``rollout/servers_ready``.
        """
        out: dict[str, float] = {}
        with self._cond:
            for s in self.servers:
                p, st = f'rollout/server/{s.index}/', s.stats
                for key in ('requests', 'failures', 'resent', 'taken_out', 'rejoined',
                            'max_outstanding'):
                    out[p + key] = float(st[key])
                out[p + 'tokens_per_sec'] = st['tokens'] / st['wall_s'] if st['wall_s'] else 0.0
                out[p + 'ready'] = float(s.ready)
                s.stats = collections.Counter()
            out['rollout/servers_ready'] = float(len(self.ready_servers()))
        return out

    def abort(self) -> None:
        """Ends every running :meth:`map` call: nothing more is dispatched or sent (a
        request not yet on the wire, or waiting to be retried, fails at once:
        :meth:`HTTPPool.abort <gepo_xtuner.rollout.server.http.HTTPPool.abort>`), and the
        call raises :class:`PoolAbortedError` once the requests in flight have returned
        (the caller makes the servers end them, e.g. vLLM's ``/abort_requests``, and can
        wait for that with :meth:`wait_idle`). The pool takes no calls afterwards. Queued
        work is never dropped unrun (every dispatched request returns or fails), so no
        call waits forever."""
        with self._cond:
            self._aborted = True
            self._cond.notify_all()
        for s in self.servers:
            s.http.abort()

    def busy_servers(self) -> list[Server]:
        """The servers with requests of :meth:`map` calls in flight."""
        with self._cond:
            return [s for s in self.servers if s.outstanding]

    def wait_idle(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` until no request is in flight; True once none is."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while any(s.outstanding for s in self.servers):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        """Stops the threads and closes every connection (idempotent)."""
        for ex in self._executors.values():
            ex.shutdown(wait=False, cancel_futures=True)
        self._executors.clear()
        for s in self.servers:
            s.http.close()
