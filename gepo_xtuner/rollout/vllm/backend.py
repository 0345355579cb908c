"""Rollouts from vLLM's OpenAI-compatible API server over HTTP (``vllm serve``)."""

import hashlib
import json
import shlex
from collections.abc import Sequence
from typing import Any

from torch import nn

from ...registry import ROLLOUT_BACKENDS
from ..base import RolloutRequest, RolloutSample, SamplingParams
from ..server.backend import ServerBackendError, ServerRolloutBackend
from ..server.http import HTTPPool, ServerRequestError
from ..server.pool import ServerPool
from ..server.probe import check_probe_setting
from .protocol import (
    VLLMProtocolError,
    build_batch_payload,
    build_probe_payload,
    fill_cut_choices,
    merge_stream,
    parse_completions,
    parse_probe,
)
from .server import LAUNCH_KEYS, WORKER_EXTENSION, WORKER_EXTENSION_DIR, VLLMServerProcess

WEIGHT_SYNC_MODES = ('disk', 'none')
#: ``weight_sync.reload`` -> the worker method ``POST /collective_rpc`` calls
RELOADS = {'gepo': 'gepo_reload_weights', 'vllm': 'reload_weights'}


class VLLMServerError(ServerBackendError):
    """The vLLM server could not do what was asked (the message says what to check)."""


def _split(items: list[int], parts: int) -> list[list[int]]:
    """``items`` in order, as ``min(parts, len(items))`` runs whose lengths differ by at
    most one (the longer ones first)."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for p in range(parts):
        end = start + size + (p < extra)
        out.append(items[start:end])
        start = end
    return out


@ROLLOUT_BACKENDS.register_module()
class VLLMRolloutBackend(ServerRolloutBackend):
    """K responses per prompt from one or several vLLM API servers, with token ids and raw
    logprobs; the trainer's weights pushed into the running servers after every step.

    Prompts go to the server as ``POST /v1/completions`` with ``n=K`` and the prompts' token
    ids (:mod:`~gepo_xtuner.rollout.vllm.protocol`), so a group always comes from one server
    and one weight version. An unseeded call puts its prompts in one request per ready
    server (at most ``max_batch_seqs`` sequences each), so that every prompt is on a server
    at once in as few requests as that takes (a server batches the sequences of all its
    requests, and each request costs its API process work); a seeded call
    (``params.seed``) sends one request per prompt, because vLLM gives every prompt of a
    request the same seed and prompts would share their random streams. Requests go to the ready server with the fewest outstanding
    (up to ``max_concurrency`` each); a server that dies or stops answering is taken out
    and its requests go once more to the others
    (:class:`~gepo_xtuner.rollout.server.pool.ServerPool`). An answer with fewer
    responses or tokens than asked is an error, never a partial group.

    Weight pushes (``weight_sync=dict(mode='disk', shared_dir=...)``): rank 0 saves the
    policy as safetensors under ``shared_dir`` (a directory every server can read; by
    default a new directory in ``/dev/shm``, in memory, for servers on the trainer's
    machine, removed at :meth:`close`), then per server ``POST /pause?mode=wait``
    (no request in flight), ``POST /collective_rpc`` with ``gepo_reload_weights`` (an
    in-place reload, see :mod:`~gepo_xtuner.rollout.vllm.worker_extension.gepo_vllm_worker`
    for why not vLLM's own), ``POST /reset_prefix_cache`` and ``POST /resume``. The
    server process is never restarted. Every push is then checked (unless
    ``probe_tolerance=None``): the server scores a fixed probe sequence
    (``prompt_logprobs``), whose logprobs must be within ``probe_tolerance`` of the
    trainer's and must have changed if the trainer's did
    (:mod:`~gepo_xtuner.rollout.server.probe`); a server that fails is taken out.

    Servers must run with ``VLLM_SERVER_DEV_MODE=1``, ``--logprobs-mode raw_logprobs``
    (vLLM's default), ``--generation-config vllm`` and the worker extension
    (:func:`start_command`; ``launch`` does all of it). See ``docs/vllm.md``.

    Args:
        server_url: running servers: one URL, a list, or URLs separated by commas.
        launch: start one server instead; keys of
            :class:`~gepo_xtuner.rollout.vllm.server.VLLMServerProcess` (``model_path``
            and ``python``, the vLLM environment's interpreter, at least).
        weight_sync: ``dict(mode='disk', shared_dir=None, keep=2, probe_tolerance=1.0,
            reload='gepo')`` or ``dict(mode='none')`` (weights never change; it takes no
            ``probe_tolerance``). ``probe_tolerance``: the push check's largest gap (nats
            per probe token; ``None`` switches the check off; 1e-3 suits float32 servers).
            ``reload``: ``'gepo'``, the worker extension's reload; ``'vllm'``, vLLM's own
            ``reload_weights``, for servers started without the extension (on the CPU build
            it leaves a tied ``lm_head`` on the old weights: a float32 server's
            ``probe_tolerance`` of 1e-3 catches it). ``base_model``: a directory whose
            non-weight files (chat template,
            processor configs) are copied beside the pushed weights; a launched server's
            model by default. ``None`` (default) makes
            :meth:`update_weights` raise, so a run cannot silently sample stale weights.
        sleep_wake: must be False: vLLM's sleep mode (weights offloaded and KV cache
            freed between rollouts) exists on CUDA and ROCm only.
        max_concurrency, timeout_s, max_retries, backoff_s, retry_after_s, api_key: as
            :class:`~gepo_xtuner.rollout.server.backend.ServerRolloutBackend`;
            ``timeout_s`` is for one request (a whole group, or several).
        model_name: the served model name; None asks the first server (``GET /v1/models``).
        max_batch_seqs: sequences (prompts times ``n``) one unseeded request asks for at
            most (default 256, twice a CPU server's ``max_num_seqs``); below ``2 * n``
            (e.g. 0): one request per prompt, always.

    Raises:
        ValueError: a bad combination of arguments (the message says which).
    """

    ENGINE = 'vLLM'
    PROCESS = VLLMServerProcess
    LAUNCH_KEYS = LAUNCH_KEYS
    ERROR = VLLMServerError
    SOURCES = {'server_url': "running servers, e.g. 'http://127.0.0.1:8000'",
               'launch': "dict(model_path=..., python='work_dirs/vllm_env/bin/python') to start "
                         'one'}
    #: every request a server runs (needs ``VLLM_SERVER_DEV_MODE=1``)
    ABORT_PATH = '/abort_requests'
    #: ``prompt_logprobs`` scores a given sequence: pushes are checked
    SCORES_PROBE = True
    PROTOCOL_ERRORS = (VLLMProtocolError, )
    #: a server given by address may hold another run's weights
    PUSH_AT_ATTACH = True
    #: the OpenAI-compatible server lists its model there (another service does not)
    IDENTITY_PATH = '/v1/models'

    def __init__(self, server_url: str | Sequence[str] | None = None,
                 launch: dict | None = None, weight_sync: dict | None = None,
                 sleep_wake: bool = False, max_concurrency: int = 64,
                 timeout_s: float = 600.0, max_retries: int = 2, backoff_s: float = 1.0,
                 retry_after_s: float = 30.0, api_key: str | None = None,
                 model_name: str | None = None, max_batch_seqs: int = 256) -> None:
        if sleep_wake:
            raise ValueError(
                "VLLMRolloutBackend: sleep_wake=True asks vLLM's sleep mode (weights offloaded "
                'and the KV cache freed while the trainer runs), which vLLM implements for CUDA '
                'and ROCm devices only (its CuMemAllocator); on CPU, and for a server on other '
                'GPUs than the trainer, set sleep_wake=False')
        super().__init__(server_url, launch, max_concurrency=max_concurrency,
                         timeout_s=timeout_s, max_retries=max_retries, backoff_s=backoff_s,
                         retry_after_s=retry_after_s, api_key=api_key,
                         weight_sync=_check_weight_sync(weight_sync),
                         numbers={'max_batch_seqs': (max_batch_seqs, 0, False)})
        self.max_batch_seqs = int(max_batch_seqs)
        self.model_name = model_name if model_name is not None else (
            None if self.server is None else self.server.served_model_name)
        self.requests_sent = 0  # numbers the per-request seeds (checkpointed)

    def start_hint(self) -> str:
        return start_command('MODEL')

    # ----------------------------------------------------------------- lifecycle
    # attach is the base's: with weight_sync mode 'disk' it pushes ``model``'s weights
    # (PUSH_AT_ATTACH), since a server given by server_url may hold another run's.
    def _on_pool(self, pool: ServerPool) -> None:
        if self.model_name is None:
            first = pool.ready_servers()[0]
            self.model_name = _served_model(first.http, self._identity.get(first.index))

    def _abort_refused_hint(self) -> str:
        return ' (start it with VLLM_SERVER_DEV_MODE=1)'

    def overlap_refusal(self) -> str | None:
        """None: the servers generate while the trainer updates; the loop never pushes
        weights while :meth:`generate` runs, and a push pauses each server (``mode=wait``)
        before it reloads."""
        return None

    def partial_refusal(self) -> str | None:
        """None: :meth:`preempt` sends ``POST /abort_requests``, and a streamed answer cut
        by it keeps the tokens it had (a non-streamed one comes back empty on vLLM 0.32), so
        after :meth:`prepare_partial` every answer is streamed (``stream: true``)."""
        return None

    # ---------------------------------------------------------------- generation
    def generate(self, requests: Sequence[RolloutRequest], params: SamplingParams
                 ) -> list[list[RolloutSample]]:
        """``params.n`` responses per request, ``result[i][j]`` answering ``requests[i]``.

        With ``params.seed`` set, request ``r`` (counted over the run, checkpointed) is
        sampled with :func:`request_seed` ``(params.seed, r, n)``.

        After :meth:`prepare_partial` the answers are streamed, and a call that
        :meth:`preempt` cuts returns each response's tokens so far with
        ``finish_reason='abort'``.

        Raises:
            VLLMServerError: a request failed for good, an answer was short, no server is
                left, or the backend was aborted; the message names the server and what
                to check.
            VLLMProtocolError: a request the backend cannot send (images, or ``extra``
                fields the backend sets itself).
        """
        self._ensure_server()
        with self._epoch_lock:
            epoch, streaming = self._epoch, self._partial
            first, self.requests_sent = self.requests_sent, self.requests_sent + len(requests)
        batches = self._batches(requests, params, first)

        def send(http: HTTPPool, batch: tuple[list[int], dict[str, Any]]
                 ) -> list[list[RolloutSample]]:
            if epoch != self._epoch:  # preempted before it was sent: nothing generated
                return [[RolloutSample([], [], 'abort') for _ in range(params.n)]
                        for _ in batch[0]]
            if not streaming:
                return parse_completions(http.request('POST', '/v1/completions', json=batch[1]),
                                         params, len(batch[0]))
            events = http.request('POST', '/v1/completions', json={**batch[1], 'stream': True},
                                  stream=True)
            body = merge_stream(events)
            cut = epoch != self._epoch or not body['choices'] or any(
                c['finish_reason'] == 'abort' for c in body['choices'])
            if cut:  # by this rank or another one sharing the server: a response with no
                # token yet is not streamed at all
                body = fill_cut_choices(body, len(batch[0]) * params.n)
            return parse_completions(body, params, len(batch[0]), partial=True)

        answers = self._map(send, batches,
                            size=lambda groups: sum(len(s.response_ids) for g in groups for s in g),
                            path='POST /v1/completions', protocol_errors=(VLLMProtocolError, ))
        out: list[list[RolloutSample]] = [[] for _ in requests]
        for (indices, _), groups in zip(batches, answers):
            for i, group in zip(indices, groups):
                out[i] = group
        return out

    def _batches(self, requests: Sequence[RolloutRequest], params: SamplingParams,
                 first: int) -> list[tuple[list[int], dict[str, Any]]]:
        """The requests to send: ``(indices into requests, body)`` each.

        Seeded, or with ``max_batch_seqs < 2 * n``: one body per request, seeded with
        :func:`request_seed` of its number in the run (``first + i``). Otherwise requests
        with equal ``extra`` go together in call order, in near-equal bodies, as many as
        the ready servers or as ``max_batch_seqs // n`` prompts per body needs, whichever
        is more (never more than the prompts): every prompt is on a server at once (none
        waits in this process for a slot), in as few requests as that takes (each request
        costs the server's API process work on the cores its engine may share).
        """
        most = self.max_batch_seqs // params.n
        if params.seed is not None or most <= 1:
            return [([i], build_batch_payload(
                self.model_name, [r], params,
                None if params.seed is None else request_seed(params.seed, first + i, params.n)))
                for i, r in enumerate(requests)]
        servers = max(1, len(self._pool.ready_servers()))
        alike: dict[str, list[int]] = {}  # extra (as sorted JSON) -> indices, in call order
        for i, r in enumerate(requests):
            alike.setdefault(json.dumps(r.extra, sort_keys=True, default=repr), []).append(i)
        return [(chunk, build_batch_payload(self.model_name, [requests[i] for i in chunk],
                                            params, None))
                for indices in alike.values()
                for chunk in _split(indices, max(servers, -(-len(indices) // most)))]

    def probe_logprobs(self, ids: Sequence[int], server: int = 0) -> list[float]:
        """The server's ``log p(ids[t] | ids[:t])``, ``t >= 1``, under its current weights."""
        self._ensure_server()
        try:
            return self._score(self._pool.servers[server].http, ids, self.timeout_s)
        except ServerRequestError as e:
            raise VLLMServerError(self._explain(e)) from e

    def _score(self, http: HTTPPool, ids: Sequence[int], timeout_s: float) -> list[float]:
        """One ``/v1/completions`` with ``prompt_logprobs`` (the push check's probe)."""
        return parse_probe(http.request('POST', '/v1/completions', timeout_s=timeout_s,
                                        json=build_probe_payload(self.model_name, ids)), ids)

    def _hints(self, e: ServerRequestError) -> list[str]:
        if e.status == 404 and '/collective_rpc' in str(e):
            return ['The server has no /collective_rpc: start it with VLLM_SERVER_DEV_MODE=1 '
                    '(see start_command / docs/vllm.md).']
        return []

    # ------------------------------------------------------------- weight sync
    def _weight_sync_modes(self) -> str:
        return "mode 'disk', shared_dir=..."

    def _push_weights(self, model: nn.Module, version: int) -> dict:
        """Rank 0: the weights saved once, then reloaded by every server that is up (the
        base checks each push with the probe afterwards)."""
        cfg = self.weight_sync
        base = self.server.model_path if self.server is not None else cfg.get('base_model')
        path = self._save_weight_files(model, version, cfg.get('shared_dir'),
                                       int(cfg.get('keep', 2)), base)
        synced, out = {}, {}
        method = RELOADS[cfg.get('reload', 'gepo')]
        for s, why in self._servers_to_push():
            if why is not None:
                out[s.index] = why
                continue
            try:
                self._paused(s, lambda s=s: _reload(s.http, str(path), method, self.timeout_s),
                             self.timeout_s)
            except ServerRequestError as e:
                out[s.index] = f'weight push {version} failed: {e}' + _push_hint(e, method)
                continue
            synced[s.index] = version
        return {'synced': synced, 'out': out}

    def state_dict(self) -> dict[str, Any]:
        """The weight-update counter (it numbers the weight directories) and the request
        counter (it numbers the per-request seeds)."""
        return {**super().state_dict(), 'requests_sent': self.requests_sent}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.requests_sent = int(state.get('requests_sent', self.requests_sent))

    # ------------------------------------------------------------ pause / resume
    def _pause(self, http: HTTPPool, timeout_s: float) -> None:
        """``POST /pause?mode=wait``: new requests wait, those in flight finish."""
        http.request('POST', '/pause', params={'mode': 'wait'}, timeout_s=timeout_s)

    def _resume(self, http: HTTPPool, timeout_s: float, retries: int | None = None) -> None:
        http.request('POST', '/resume', timeout_s=timeout_s,
                     **({} if retries is None else {'retries': retries}))


def start_command(model_path: str, python: str = 'python', port: int = 8000) -> str:
    """The shell line that starts a server this backend can push weights into."""
    command = VLLMServerProcess(model_path, port=port, python=python).command_line()
    return (f'VLLM_SERVER_DEV_MODE=1 PYTHONPATH={shlex.quote(WORKER_EXTENSION_DIR)} '
            f'{command}')


def request_seed(seed: int, request: int, n: int) -> int:
    """The seed of the run's request number ``request`` under ``sampling.seed=seed``.

    vLLM seeds response ``j`` of a request with ``seed + j``, so consecutive seeds would
    give request ``r``'s response ``j + 1`` the stream of request ``r + 1``'s response ``j``
    (and ranks, whose seeds differ by one, each other's). The seed is a hash of
    ``(seed, request)``, below ``2**62 - n`` (vLLM takes signed 64-bit seeds).
    """
    digest = hashlib.blake2b(f'{int(seed)}:{int(request)}'.encode(), digest_size=8).digest()
    return int.from_bytes(digest, 'little') % (2**62 - max(int(n), 1))


def _check_weight_sync(cfg: dict | None) -> dict | None:
    if cfg is None:
        return None
    if not isinstance(cfg, dict) or cfg.get('mode') not in WEIGHT_SYNC_MODES:
        raise ValueError(f'weight_sync must be dict(mode=...) with mode in {WEIGHT_SYNC_MODES}, '
                         f'got {cfg!r}')
    known = {'mode', 'shared_dir', 'keep', 'probe_tolerance', 'base_model', 'reload'}
    if cfg.get('reload', 'gepo') not in RELOADS:
        raise ValueError(f"weight_sync.reload must be one of {sorted(RELOADS)}, got "
                         f"{cfg['reload']!r}")
    if set(cfg) - known:
        raise ValueError(f'weight_sync does not take {sorted(set(cfg) - known)}; it takes '
                         f'{sorted(known)}')
    check_probe_setting(cfg)
    return dict(cfg)


def _reload(http: HTTPPool, path: str, method: str, timeout_s: float) -> None:
    """Reload in place (the server is paused), then drop the cached prefixes."""
    http.request('POST', '/collective_rpc', timeout_s=timeout_s,
                 json={'method': method, 'kwargs': {'weights_path': path}})
    http.request('POST', '/reset_prefix_cache', timeout_s=timeout_s)


def _push_hint(e: Exception, method: str) -> str:
    """What to check when a push failed with ``e``."""
    status = getattr(e, 'status', None)
    if status == 404:
        return (' (no RL endpoints: start the server with VLLM_SERVER_DEV_MODE=1, see '
                'start_command)')
    if status is not None and status >= 500 and method == RELOADS['gepo']:
        return (' (a server without the worker extension answers this: start it with '
                f'--worker-extension-cls {WORKER_EXTENSION} and {WORKER_EXTENSION_DIR} on '
                "PYTHONPATH, see start_command; or set weight_sync.reload='vllm')")
    return ''


def _served_model(http: HTTPPool, body: Any = None) -> str:
    """The first model ``GET /v1/models`` lists (``body``: its answer, when asked already)."""
    if body is None:
        body = http.request('GET', '/v1/models', timeout_s=30.0)
    try:
        return str(body['data'][0]['id'])
    except (KeyError, IndexError, TypeError):
        raise VLLMServerError(f'{http.base_url}/v1/models lists no model: {str(body)[:300]}') \
            from None


__all__ = ['VLLMRolloutBackend', 'VLLMServerError', 'request_seed', 'start_command',
           'WORKER_EXTENSION']
