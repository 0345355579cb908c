"""Rollouts from vLLM's OpenAI-compatible API server over HTTP (``vllm serve``)."""

import atexit
import hashlib
import logging
import math
import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import httpx
import torch
from mmengine.logging import print_log
from torch import nn

from ...registry import ROLLOUT_BACKENDS
from ..base import RolloutBackend, RolloutRequest, RolloutSample, SamplingParams
from ..lmdeploy.backend import _barrier, _on_rank0, _split_urls, _world_size
from ..lmdeploy.weights import save_weights
from ..lmdeploy.server import runs_remote_code
from ..server.http import HTTPPool, ServerRequestError
from ..server.pool import NoServerError, Server, ServerPool, is_ready
from .protocol import (
    VLLMProtocolError,
    build_completion_payload,
    build_probe_payload,
    parse_completion,
    parse_probe,
)
from .server import LAUNCH_KEYS, WORKER_EXTENSION, WORKER_EXTENSION_DIR, VLLMServerProcess

WEIGHT_SYNC_MODES = ('disk', 'none')
#: ``weight_sync.reload`` -> the worker method ``POST /collective_rpc`` calls
RELOADS = {'gepo': 'gepo_reload_weights', 'vllm': 'reload_weights'}
#: seconds :meth:`VLLMRolloutBackend.abort` waits before it sends ``POST /abort_requests``
#: again while requests of the aborted call are in flight: the first wait, doubled each
#: time up to the second
ABORT_RESEND_S = (0.05, 1.0)


class VLLMServerError(RuntimeError):
    """The vLLM server could not do what was asked (the message says what to check)."""


@ROLLOUT_BACKENDS.register_module()
class VLLMRolloutBackend(RolloutBackend):
    """K responses per prompt from one or several vLLM API servers, with token ids and raw
    logprobs; the trainer's weights pushed into the running servers after every step.

    Each prompt is one ``POST /v1/completions`` with ``n=K`` and the prompt's token ids
    (:mod:`~gepo_xtuner.rollout.vllm.protocol`), so a group always comes from one server
    and one weight version. Requests go to the ready server with the fewest outstanding
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
    server process is never restarted. With ``probe_tolerance``, every push is proven:
    the server scores a fixed probe sequence and the largest difference from the
    trainer's logprobs must be within the tolerance.

    Servers must run with ``VLLM_SERVER_DEV_MODE=1``, ``--logprobs-mode raw_logprobs``
    (vLLM's default), ``--generation-config vllm`` and the worker extension
    (:func:`start_command`; ``launch`` does all of it). See ``docs/vllm.md``.

    Args:
        server_url: running servers: one URL, a list, or URLs separated by commas.
        launch: start one server instead; keys of
            :class:`~gepo_xtuner.rollout.vllm.server.VLLMServerProcess` (``model_path``
            and ``python``, the vLLM environment's interpreter, at least).
        weight_sync: ``dict(mode='disk', shared_dir=None, keep=2, probe_tolerance=None,
            reload='gepo')`` or ``dict(mode='none')`` (weights never change). ``reload``:
            ``'gepo'``, the worker extension's reload; ``'vllm'``, vLLM's own
            ``reload_weights``, for servers started without the extension (on the CPU build
            it leaves a tied ``lm_head`` on the old weights: set ``probe_tolerance`` to
            catch it). ``base_model``: a directory whose non-weight files (chat template,
            processor configs) are copied beside the pushed weights; a launched server's
            model by default. ``None`` (default) makes
            :meth:`update_weights` raise, so a run cannot silently sample stale weights.
        sleep_wake: must be False: vLLM's sleep mode (weights offloaded and KV cache
            freed between rollouts) exists on CUDA and ROCm only.
        max_concurrency, timeout_s, max_retries, backoff_s, retry_after_s, api_key: as
            :class:`~gepo_xtuner.rollout.lmdeploy.backend.LMDeployRolloutBackend`;
            ``timeout_s`` is for one request (a whole group).
        model_name: the served model name; None asks the first server (``GET /v1/models``).

    Raises:
        ValueError: a bad combination of arguments (the message says which).
    """

    def __init__(self, server_url: str | Sequence[str] | None = None,
                 launch: dict | None = None, weight_sync: dict | None = None,
                 sleep_wake: bool = False, max_concurrency: int = 16,
                 timeout_s: float = 600.0, max_retries: int = 2, backoff_s: float = 1.0,
                 retry_after_s: float = 30.0, api_key: str | None = None,
                 model_name: str | None = None) -> None:
        urls = _split_urls(server_url)
        if bool(urls) == (launch is not None):
            raise ValueError('VLLMRolloutBackend needs exactly one of server_url (running '
                             "servers, e.g. 'http://127.0.0.1:8000') or launch (dict(model_path"
                             "=..., python='work_dirs/vllm_env/bin/python') to start one)")
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
        if sleep_wake:
            raise ValueError(
                "VLLMRolloutBackend: sleep_wake=True asks vLLM's sleep mode (weights offloaded "
                'and the KV cache freed while the trainer runs), which vLLM implements for CUDA '
                'and ROCm devices only (its CuMemAllocator); on CPU, and for a server on other '
                'GPUs than the trainer, set sleep_wake=False')
        if max_concurrency < 1 or timeout_s <= 0 or max_retries < 0 or backoff_s < 0 \
                or retry_after_s < 0:
            raise ValueError('need max_concurrency >= 1, timeout_s > 0, max_retries >= 0, '
                             'backoff_s >= 0 and retry_after_s >= 0; got '
                             f'{max_concurrency}, {timeout_s}, {max_retries}, {backoff_s}, '
                             f'{retry_after_s}')
        self.weight_sync = _check_weight_sync(weight_sync)
        self.server_urls = urls
        self.server = None if launch is None else VLLMServerProcess(**launch)
        self.max_concurrency = int(max_concurrency)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.retry_after_s = float(retry_after_s)
        self.api_key = api_key
        self.model_name = model_name if model_name is not None else (
            None if self.server is None else self.server.served_model_name)
        self.tokenizer: Any = None
        self.num_updates = 0
        self.requests_sent = 0  # numbers the per-request seeds (checkpointed)
        self.last_probe_diff: float | None = None
        self._probe_ids: list[int] | None = None
        self._pool: ServerPool | None = None
        self._own_dir: str | None = None  # the default shared_dir, made at the first push
        self._aborted = False

    @property
    def url(self) -> str:
        """The servers' addresses (a launched server's once it started)."""
        if self.server is not None:
            return self.server.url
        return ', '.join(self._pool.urls if self._pool is not None else self.server_urls)

    # ----------------------------------------------------------------- lifecycle
    def attach(self, model: nn.Module, tokenizer: Any) -> None:
        """Keeps the tokenizer (saved with the pushed weights), reaches the servers and,
        with ``weight_sync`` mode ``'disk'``, pushes ``model``'s weights into them: a server
        given by ``server_url`` may hold anything (another run's last weights), and the
        first step must sample from the trainer's. Every rank calls it."""
        self.tokenizer = tokenizer
        if self.server is not None and self.server.trust_remote_code is None:
            self.server.trust_remote_code = runs_remote_code(model)  # the trainer's checkpoint
        self._ensure_server()
        if model is not None and (self.weight_sync or {}).get('mode') == 'disk':
            self._sync(model, self._pool.version, count=False)

    def _ensure_server(self) -> None:
        if self._aborted:
            raise VLLMServerError('this VLLMRolloutBackend was aborted (its step failed); build '
                                  'a new one to generate again')
        if self._pool is not None:
            return
        if self.server is not None:
            if self.server.port == 0 and _world_size() > 1:
                raise ValueError('launch.port=0 (any free port) works in one process only; set '
                                 'a fixed launch.port for multi-process training')
            _on_rank0(self.server.start)
        urls = [self.server.url] if self.server is not None else self.server_urls
        headers = None if self.api_key is None else {'Authorization': f'Bearer {self.api_key}'}
        pool = ServerPool(urls, self.max_concurrency, self.timeout_s, self.max_retries,
                          self.backoff_s, headers, self.retry_after_s,
                          track_weights=self.weight_sync is not None
                          and self.weight_sync['mode'] != 'none')
        for s in pool.servers:
            pool.mark_synced(s, pool.version)
            ok, why = is_ready(s.http, min(self.timeout_s, 30.0))
            if not ok:
                pool.mark_out(s, why)
        if not pool.ready_servers():
            pool.close()
            raise VLLMServerError(pool.describe_out(f'no healthy vLLM server at {self.url}')
                                  + f'\nStart one, e.g. `{start_command("MODEL")}`, or fix '
                                  'server_url')
        if self.model_name is None:
            self.model_name = _served_model(pool.ready_servers()[0].http)
        self._pool = pool

    def close(self) -> None:
        """Closes connections, stops a launched server and removes the default shared_dir."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self.server is not None:
            self.server.close()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None

    def abort(self) -> None:
        """Cancels the groups in flight and returns once none is left.

        Nothing more is sent (:meth:`ServerPool.abort
        <gepo_xtuner.rollout.server.pool.ServerPool.abort>`) and each server that runs
        requests of this backend aborts every request it runs (``POST /abort_requests``;
        on a server other trainer ranks share, their requests too, which is what a failed
        step wants). A request still on its way when that call reached the server is not
        among them and would run to its end (``max_new_tokens`` of generation), so the
        call is sent again, after 0.05 s, then 0.1 s, ... up to every second
        (:data:`ABORT_RESEND_S`), to the servers that still run requests of this backend,
        until none is in flight or ``timeout_s`` passed. A server that refuses the call
        (no ``VLLM_SERVER_DEV_MODE=1``) is warned about once and not asked again: its
        requests run to their end, and this call waits for them (at most ``timeout_s``).
        A :meth:`generate` running on another thread then raises; later calls raise
        too. With nothing in flight, no server is contacted."""
        self._aborted = True
        pool = self._pool
        if pool is None:
            return
        pool.abort()
        headers = None if self.api_key is None else {'Authorization': f'Bearer {self.api_key}'}
        deadline = time.monotonic() + self.timeout_s
        wait, longest = ABORT_RESEND_S
        refused: set[int] = set()
        while True:
            for s in pool.busy_servers():
                left = deadline - time.monotonic()
                if s.index in refused or left <= 0:
                    continue
                try:
                    resp = httpx.post(f'{s.url}/abort_requests', json={}, headers=headers,
                                      timeout=min(10.0, left))
                except httpx.HTTPError:
                    continue  # a dead server runs nothing; its requests fail on their own
                if not resp.is_success:
                    refused.add(s.index)
                    print_log(f'vLLM server {s.url}: POST /abort_requests answered HTTP '
                              f'{resp.status_code}; its requests in flight run to their end '
                              '(start it with VLLM_SERVER_DEV_MODE=1)', logger='current',
                              level=logging.WARNING)
            if pool.wait_idle(max(0.0, min(wait, deadline - time.monotonic()))):
                return
            if time.monotonic() >= deadline:
                print_log(f'VLLMRolloutBackend.abort: requests still in flight after '
                          f'timeout_s={self.timeout_s:g} s; the generating thread ends when '
                          'they fail or time out', logger='current', level=logging.WARNING)
                return
            wait = min(2 * wait, longest)

    def logprob_temperature(self, params: SamplingParams) -> float:
        """1: the servers run with ``--logprobs-mode raw_logprobs`` (``log_softmax`` of
        the raw logits, before the sampling temperature)."""
        return 1.0

    def overlap_refusal(self) -> str | None:
        """None: the servers generate while the trainer updates; the loop never pushes
        weights while :meth:`generate` runs, and a push pauses each server (``mode=wait``)
        before it reloads."""
        return None

    def pop_metrics(self) -> dict[str, float]:
        """Per-server figures since the last call (``rollout/server/<i>/...``), and
        ``rollout/probe_abs_diff`` (the last push's probe, when probes are on)."""
        out = {} if self._pool is None else self._pool.pop_metrics()
        if self.last_probe_diff is not None:
            out['rollout/probe_abs_diff'] = self.last_probe_diff
            self.last_probe_diff = None
        return out

    # ---------------------------------------------------------------- generation
    def generate(self, requests: Sequence[RolloutRequest], params: SamplingParams
                 ) -> list[list[RolloutSample]]:
        """``params.n`` responses per request, ``result[i][j]`` answering ``requests[i]``.

        With ``params.seed`` set, request ``r`` (counted over the run, checkpointed) is
        sampled with :func:`request_seed` ``(params.seed, r, n)``.

        Raises:
            VLLMServerError: a request failed for good, an answer was short, no server is
                left, or the backend was aborted; the message names the server and what
                to check.
            VLLMProtocolError: a request the backend cannot send (images, or ``extra``
                fields the backend sets itself).
        """
        self._ensure_server()
        first, self.requests_sent = self.requests_sent, self.requests_sent + len(requests)
        payloads = [build_completion_payload(
            self.model_name, r, params,
            None if params.seed is None else request_seed(params.seed, first + i, params.n))
            for i, r in enumerate(requests)]
        pool = self._pool
        if self._aborted:  # abort() came while the servers were being reached
            raise VLLMServerError('generation aborted (VLLMRolloutBackend.abort) before any '
                                  'request was sent')
        try:
            return pool.map(lambda http, body: parse_completion(
                http.request('POST', '/v1/completions', json=body), params), payloads,
                size=lambda group: sum(len(s.response_ids) for s in group))
        except Exception as e:
            if self._aborted:  # whatever the cancelled requests raised
                raise VLLMServerError(f'generation aborted (VLLMRolloutBackend.abort): {e}') \
                    from e
            if isinstance(e, ServerRequestError):
                raise VLLMServerError(self._explain(e)) from e
            if isinstance(e, NoServerError):
                raise VLLMServerError(f'{e}\nCheck that the servers run and that this machine '
                                      'reaches them (curl URL/health).') from e
            if isinstance(e, VLLMProtocolError):
                raise VLLMServerError(f'vLLM server {self.url}, POST /v1/completions: {e}') \
                    from e
            raise

    def probe_logprobs(self, ids: Sequence[int], server: int = 0) -> list[float]:
        """The server's ``log p(ids[t] | ids[:t])``, ``t >= 1``, under its current weights."""
        self._ensure_server()
        http = self._pool.servers[server].http
        try:
            return parse_probe(http.request('POST', '/v1/completions',
                                            json=build_probe_payload(self.model_name, ids)), ids)
        except ServerRequestError as e:
            raise VLLMServerError(self._explain(e)) from e

    def _explain(self, e: ServerRequestError) -> str:
        parts = [f'vLLM server {self.url}: {e}']
        if e.status == 404 and '/collective_rpc' in str(e):
            parts.append('The server has no /collective_rpc: start it with '
                         'VLLM_SERVER_DEV_MODE=1 (see start_command / docs/vllm.md).')
        if self.server is not None:
            parts.append(f'Server log {self.server.log_file} ends with:\n{self.server.log_tail()}')
        elif e.status is None:
            parts.append(f'Check that the server runs and that this machine reaches it '
                         f'(curl {e.url or self.url}/health).')
        if self._pool is not None and len(self._pool.servers) > 1:
            parts.append(self._pool.describe_out('Servers'))
        return '\n'.join(parts)

    # ------------------------------------------------------------- weight sync
    def update_weights(self, model: nn.Module) -> None:
        """Makes every ready server sample from ``model``'s current weights.

        Rank 0 saves the weights once and pushes them to every server (servers that were
        out and answer healthy again get them and rejoin); a server the push fails on is
        taken out, on every rank. Every rank calls this.

        Raises:
            VLLMServerError: no ``weight_sync`` configured, no server took the weights, or
                a probe differed by more than ``probe_tolerance``.
        """
        if self.weight_sync is None:
            raise VLLMServerError(
                'VLLMRolloutBackend.update_weights: no weight_sync configured, so the servers '
                "would keep sampling from their initial weights; set weight_sync=dict(mode="
                "'disk', shared_dir=...) for training, or dict(mode='none') for servers whose "
                'weights never change')
        if self.weight_sync['mode'] == 'none':
            return
        self._ensure_server()
        self._sync(model, self._pool.version + 1, count=True)

    def _sync(self, model: nn.Module, version: int, count: bool) -> None:
        """Every rank: waits for all ranks (none is still generating: another rank's
        requests must not meet the new weights), then rank 0 pushes ``model`` as weights
        ``version`` and every rank learns which servers took them."""
        if any(hasattr(p, 'ds_id') for p in model.parameters()):
            raise VLLMServerError(
                'the policy is partitioned by DeepSpeed ZeRO-3; pushing shards to vLLM servers '
                'is not supported: train with ZeRO-2 or DDP (full parameters on rank 0)')
        _barrier()
        pool = self._pool
        report = _on_rank0(lambda: self._push_all(model, version))
        pool.version = version
        for i, s in enumerate(pool.servers):
            if i in report['synced']:
                pool.mark_synced(s, version)
            else:
                pool.mark_out(s, report['out'].get(i, s.reason or 'missed a weight sync'))
        if count:
            self.num_updates += 1
        self.last_probe_diff = report.get('probe')
        if not pool.ready_servers():
            raise VLLMServerError(pool.describe_out(f'weight sync {version} reached no vLLM '
                                                    'server'))

    def _push_all(self, model: nn.Module, version: int) -> dict:
        cfg = self.weight_sync
        base = self.server.model_path if self.server is not None else cfg.get('base_model')
        keep = int(cfg.get('keep', 2))
        shared = cfg.get('shared_dir') or self._default_dir(model, keep)
        path = save_weights(model, self.tokenizer, shared, version, base_model=base, keep=keep)
        synced, out, worst = {}, {}, None
        tolerance = cfg.get('probe_tolerance')
        expected = self._trainer_probe(model) if tolerance is not None else None
        method = RELOADS[cfg.get('reload', 'gepo')]
        for s in self._pool.servers:
            if not s.ready:
                ok, why = is_ready(s.http, min(self.timeout_s, 30.0))
                if not ok:
                    out[s.index] = why
                    continue
            try:
                _reload(s, str(path), method, self.timeout_s)
                if expected is not None:
                    got = parse_probe(s.http.request(
                        'POST', '/v1/completions', timeout_s=self.timeout_s,
                        json=build_probe_payload(self.model_name, self._probe_ids)),
                        self._probe_ids)
            except (ServerRequestError, VLLMProtocolError) as e:
                out[s.index] = f'weight push {version} failed: {e}' + _push_hint(e, method)
                continue
            if expected is not None:
                diff = max(abs(a - b) for a, b in zip(got, expected))
                worst = diff if worst is None else max(worst, diff)
                if not diff <= tolerance:
                    raise VLLMServerError(
                        f'vLLM server {s.url}: after weight push {version} its logprobs of the '
                        f"probe differ from the trainer's by up to {diff:.3g} "
                        f'(weight_sync.probe_tolerance={tolerance:g}): the server does not run '
                        'the weights pushed (a server dtype other than the trainer\'s needs a '
                        'larger tolerance; see docs/vllm.md)')
            synced[s.index] = version
        return {'synced': synced, 'out': out, 'probe': worst}

    def _default_dir(self, model: nn.Module, keep: int) -> str:
        """A new directory for the weights, removed at :meth:`close` or exit: in
        ``/dev/shm`` (memory) when it has room for ``keep + 1`` copies, else in the
        temporary directory (a container's ``/dev/shm`` is often 64 MiB)."""
        if self._own_dir is None:
            need = (keep + 1) * sum(p.numel() * p.element_size() for p in model.parameters())
            shm = '/dev/shm'
            where = shm if os.path.isdir(shm) and shutil.disk_usage(shm).free > need else None
            self._own_dir = tempfile.mkdtemp(prefix='gepo_vllm_weights_', dir=where)
            atexit.register(shutil.rmtree, self._own_dir, True)
        return self._own_dir

    def _trainer_probe(self, model: nn.Module) -> list[float]:
        """The trainer's logprobs of the probe sequence (a fixed slice of the vocabulary)."""
        if self._probe_ids is None:
            vocab = int(getattr(getattr(model, 'config', None), 'vocab_size', 0) or 32)
            self._probe_ids = [(7 * i + 3) % vocab for i in range(16)]
        ids = torch.tensor([self._probe_ids], device=next(model.parameters()).device)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, :-1].float()
        finally:
            model.train(was_training)
        return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0].tolist()

    def state_dict(self) -> dict[str, Any]:
        """The weight-update counter (it numbers the weight directories) and the request
        counter (it numbers the per-request seeds)."""
        return {'num_updates': self.num_updates, 'requests_sent': self.requests_sent}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.num_updates = int(state.get('num_updates', self.num_updates))
        self.requests_sent = int(state.get('requests_sent', self.requests_sent))


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
    tol = cfg.get('probe_tolerance')
    if tol is not None and not (isinstance(tol, int | float) and math.isfinite(tol) and tol > 0):
        raise ValueError(f'weight_sync.probe_tolerance must be a positive number, got {tol!r}')
    return dict(cfg)


def _reload(server: Server, path: str, method: str, timeout_s: float) -> None:
    """Pause (in-flight requests finish), reload in place, drop cached prefixes, resume.

    The server is resumed whatever failed (also a pause that timed out after it took
    effect); an error of the resume does not hide the first one.
    """
    http = server.http
    try:
        http.request('POST', '/pause', params={'mode': 'wait'}, timeout_s=timeout_s)
        http.request('POST', '/collective_rpc', timeout_s=timeout_s,
                     json={'method': method, 'kwargs': {'weights_path': path}})
        http.request('POST', '/reset_prefix_cache', timeout_s=timeout_s)
    except ServerRequestError:
        try:
            http.request('POST', '/resume', timeout_s=timeout_s, retries=0)
        except ServerRequestError:
            pass
        raise
    http.request('POST', '/resume', timeout_s=timeout_s)


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


def _served_model(http: HTTPPool) -> str:
    body = http.request('GET', '/v1/models', timeout_s=30.0)
    try:
        return str(body['data'][0]['id'])
    except (KeyError, IndexError, TypeError):
        raise VLLMServerError(f'{http.base_url}/v1/models lists no model: {str(body)[:300]}') \
            from None


__all__ = ['VLLMRolloutBackend', 'VLLMServerError', 'request_seed', 'start_command',
           'WORKER_EXTENSION']
