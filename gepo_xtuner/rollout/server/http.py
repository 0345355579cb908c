"""A pooled JSON-over-HTTP client with bounded concurrency, timeouts and retries."""

import concurrent.futures as cf
import json as _json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import httpx

T = TypeVar('T')
_RETRY_STATUS = frozenset({500, 502, 503, 504})


class ServerRequestError(RuntimeError):
    """A request that failed for good (after retries, or at once for a 4xx).

    Attributes:
        status: the last HTTP status, or ``None`` when no response came.
        body: the last response body (parsed JSON when possible), or ``None``.
        url: the server's base address, when known.
    """

    def __init__(self, message: str, status: int | None = None, body: Any = None,
                 url: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.url = url


class HTTPPool:
    """JSON requests to one server from many threads over kept-alive connections.

    One ``httpx.Client`` (thread-safe, connection pool of ``max_concurrency``) and one
    thread pool of ``max_concurrency`` workers: :meth:`map` never has more than that
    many requests in flight. Connection errors, connect timeouts and 5xx answers are
    retried up to ``max_retries`` times, waiting ``backoff_s * 2**attempt`` in between;
    4xx answers are final at once, and so is a read timeout (the server took the
    request; sending it again would only double the load on a server that is already
    behind).

    Args:
        base_url: e.g. ``'http://127.0.0.1:23333'``.
        max_concurrency: requests in flight at most.
        timeout_s: per request, from connecting to the last byte of the answer.
        max_retries: extra attempts after the first.
        backoff_s: first wait between attempts (doubles each time).
        headers: sent with every request (e.g. ``Authorization``).
    """

    def __init__(self, base_url: str, max_concurrency: int = 64, timeout_s: float = 600.0,
                 max_retries: int = 3, backoff_s: float = 1.0,
                 headers: dict[str, str] | None = None) -> None:
        self.base_url = base_url.rstrip('/')
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._client = httpx.Client(
            base_url=self.base_url, headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            limits=httpx.Limits(max_connections=max_concurrency,
                                max_keepalive_connections=max_concurrency))
        self._executor: cf.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._aborted = threading.Event()

    def request(self, method: str, path: str, *, json: Any = None,
                params: dict[str, Any] | None = None, retries: int | None = None,
                timeout_s: float | None = None, stream: bool = False) -> Any:
        """One request with retries; returns the parsed JSON answer (``None`` if empty).

        With ``stream``, the answer is a stream of server-sent events, read to its end:
        returns the parsed JSON of each ``data:`` line, up to ``data: [DONE]``, in order
        (``timeout_s`` then bounds each wait for the next bytes).

        Raises:
            ServerRequestError: when it gives up, naming the address, the request and
                the last failure.
        """
        retries = self.max_retries if retries is None else retries
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else httpx.Timeout(
            timeout_s, connect=min(timeout_s, 10.0))
        # LMDeploy's management routes insist on this content type, even with no body.
        headers = {'Content-Type': 'application/json'}
        what = f'{method} {self.base_url}{path}'
        for attempt in range(retries + 1):
            if self._aborted.is_set():
                raise ServerRequestError(f'{what}: not sent, the requests to this server were '
                                         'aborted (HTTPPool.abort)', url=self.base_url)
            try:
                if stream:
                    with self._client.stream(method, path, json=json, params=params,
                                             headers=headers, timeout=timeout) as resp:
                        if resp.is_success:
                            return _events(resp)
                        resp.read()
                else:
                    resp = self._client.request(method, path, json=json, params=params,
                                                headers=headers, timeout=timeout)
            except httpx.TimeoutException as e:
                if not isinstance(e, httpx.ConnectTimeout):
                    limit = self.timeout_s if timeout_s is None else timeout_s
                    raise ServerRequestError(
                        f'{what}: no answer within {limit} s ({type(e).__name__}); the server '
                        'may be overloaded or hung: raise timeout_s or check the server',
                        url=self.base_url) from e
                failure, status, body = f'{type(e).__name__}: {e}', None, None
            except httpx.RequestError as e:  # refused, reset, closed mid-answer, ...
                failure, status, body = f'{type(e).__name__}: {e}', None, None
            else:
                body = _body(resp)
                if resp.is_success:
                    return body
                status = resp.status_code
                failure = f'HTTP {status}: {str(body)[:300]}'
                if status not in _RETRY_STATUS:
                    raise ServerRequestError(f'{what}: {failure}', status, body, self.base_url)
            if attempt < retries:
                self._aborted.wait(self.backoff_s * 2 ** attempt)
        raise ServerRequestError(
            f'{what}: failed {retries + 1} time(s), last: {failure}', status, body, self.base_url)

    def map(self, fn: Callable[[T], Any], items: Sequence[T]) -> list[Any]:
        """``[fn(x) for x in items]`` on the pool's threads, results in input order.

        The first exception cancels the calls that have not started and is raised
        (calls already running finish in the background).
        """
        with self._lock:
            if self._executor is None:
                self._executor = cf.ThreadPoolExecutor(self.max_concurrency,
                                                       thread_name_prefix='http-pool')
        futures = [self._executor.submit(fn, x) for x in items]
        _done, pending = cf.wait(futures, return_when=cf.FIRST_EXCEPTION)
        for f in futures:
            if f.done() and f.exception() is not None:
                for p in pending:
                    p.cancel()
                raise f.exception()
        return [f.result() for f in futures]

    def abort(self) -> None:
        """Sends nothing more: a :meth:`request` not yet sent, or waiting to retry, raises
        :class:`ServerRequestError` at once. Requests on the wire wait for their answer
        (the caller makes the server end them): their connections stay open, because a
        socket closed under a thread blocked on it may be reused by another connection
        and leave that thread waiting for the whole timeout."""
        self._aborted.set()

    def close(self) -> None:
        """Stops the threads and closes the connections (idempotent)."""
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None
        self._client.close()


def _events(resp: httpx.Response) -> list[Any]:
    """The JSON of each ``data:`` line of a server-sent-event answer, up to ``[DONE]``."""
    out = []
    for line in resp.iter_lines():
        if not line.startswith('data:'):
            continue
        data = line[5:].strip()
        if data == '[DONE]':
            break
        out.append(_json.loads(data))
    return out


def _body(resp: httpx.Response) -> Any:
    if not resp.content:
        return None
    try:
        return resp.json()
    except ValueError:
        return resp.text
