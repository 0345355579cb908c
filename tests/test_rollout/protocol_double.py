"""LMDeployProtocolDouble: a stand-in for ``lmdeploy serve api_server``, for failure injection.

NOT LMDeploy. The rollout tests run against LMDeploy's own API server code with a CPU
stand-in engine (``lmdeploy_cpu_engine.py``, ``test_lmdeploy_real_server.py``); this
double is kept for what that server cannot be made to do on cue: answer 5xx, hang,
drop logprobs, die and come back (``test_lmdeploy_backend.py``,
``test_lmdeploy_pool.py``). It is a real HTTP server (stdlib ``ThreadingHTTPServer``,
keep-alive) that speaks the part of LMDeploy 0.18's protocol that
``LMDeployRolloutBackend`` uses, generates with a small Hugging Face causal LM on CPU,
validates every body with LMDeploy's pydantic models and builds every ``/generate``
answer with ``GenerateReqOutput``. Where it could differ from the real server it
agrees with it (each point checked against the real server in
``test_conformance.py``):

* order of checks on ``POST /generate``: asleep (503) before the API key (401) before
  the JSON content type and the body (400, LMDeploy's error envelope, not FastAPI's 422);
* ``GET /health`` is a snapshot refreshed every ``health_poll_s`` (LMDeploy's health
  monitor: 12 s); ``GET /is_sleeping`` is live;
* ``POST /sleep`` aborts running requests (finish reason ``abort``);
* stop tokens: ``stop_token_ids`` if given, else the chat template's stop words
  (``stop_words``), plus the tokenizer's EOS and ``generation_config.json``'s
  ``eos_token_id`` (an int or a list);
* ``generation_config.json`` fills sampling fields a request leaves unset; prompts of
  ``session_len`` tokens or more are refused and generation ends at it; at most
  ``max_batch_size`` requests generate at once, the others wait; ``--api-keys``;
* weight-update-group failures answer 400 with ``{"success": false, "message"}``;
* ``/update_weights`` answers ``null``; ``/sleep`` and ``/wakeup`` an empty body.

Test hooks (in-thread use): ``fail_next`` (HTTP statuses to answer the next
``/generate`` requests with), ``delay_s`` (per ``/generate``), ``omit_logprobs``
(answer without ``output_token_logprobs``), and the records ``max_in_flight``,
``generate_attempts``, ``bodies`` and ``calls``.

Run as a server: ``python -m tests.test_rollout.protocol_double MODEL_DIR
--server-name 127.0.0.1 --server-port 23333 --logprobs-mode raw_logprobs`` (the
flags of ``lmdeploy serve api_server`` that the backend's launch command uses; and
``--delay-s``, the ``delay_s`` test hook).
"""

import argparse
import base64
import binascii
import io
import json
import socket
import threading
import time
from datetime import timedelta
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pydantic
import torch
from lmdeploy.serve.openai.protocol import (
    DestroyWeightsUpdateGroupRequest,
    ErrorResponse,
    GenerateReqInput,
    GenerateReqMetaOutput,
    GenerateReqOutput,
    InitWeightsUpdateGroupRequest,
    UpdateParamsRequest,
    UpdateWeightsFromDistributedRequest,
)
from transformers import AutoModelForCausalLM


# Sampling fields a request may leave to the model's generation_config.json.
_SAMPLING_FIELDS = ('temperature', 'top_p', 'top_k', 'min_p', 'repetition_penalty')
NULL = object()  # a JSON ``null`` answer (``None``: an empty body)


class _Reply(Exception):
    """Ends a request with an HTTP status and a JSON body."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(status)
        self.status, self.body = status, body


def _error(status: int, message: str) -> _Reply:
    """An error in LMDeploy's envelope (``ErrorResponse``)."""
    return _Reply(status, ErrorResponse(message=message, type='invalid_request_error',
                                        code=status).model_dump())


class _HTTPServer(ThreadingHTTPServer):
    # uvicorn's listen backlog: the stdlib's 5 resets connections when a client opens
    # dozens at once, which LMDeploy's server does not.
    request_queue_size = 2048


class LMDeployProtocolDouble:
    """The protocol double's state: model, sleep state, weight groups, test hooks.

    Args:
        model_path: a Hugging Face causal-LM directory (loaded in float32 on CPU).
        host: bind address.
        port: TCP port (0: any free port; see :attr:`url` after :meth:`start`).
        logprobs_mode: ``'raw_logprobs'`` or ``None`` (as LMDeploy's ``--logprobs-mode``).
    """

    def __init__(self, model_path: str, host: str = '127.0.0.1', port: int = 0,
                 logprobs_mode: str | None = 'raw_logprobs', stop_words: list[int] | None = None,
                 max_batch_size: int = 8, api_keys: list[str] | None = None,
                 session_len: int | None = None, health_poll_s: float = 12.0) -> None:
        from transformers import AutoTokenizer
        self.model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
        self.model.eval()
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = {AutoTokenizer.from_pretrained(model_path).eos_token_id} | (
            set() if eos is None else {eos} if isinstance(eos, int) else set(eos))
        self.stop_words = stop_words
        path = Path(model_path) / 'generation_config.json'
        saved = json.loads(path.read_text()) if path.is_file() else {}
        self.gen_defaults = {k: saved[k] for k in _SAMPLING_FIELDS if k in saved}
        self.session_len = session_len or self.model.config.max_position_embeddings
        self.api_keys = api_keys
        self.health_poll_s = health_poll_s
        self._health = ('healthy', time.monotonic())  # (status, probed at)
        self._slots = threading.Semaphore(max_batch_size)
        self._epoch = 0  # /sleep aborts the requests of earlier epochs
        self.logprobs_mode = logprobs_mode
        self.sleeping_tags: set[str] = set()
        self.groups: dict[str, Any] = {}
        self.fail_next: list[int] = []
        self.delay_s = 0.0
        self.token_delay_s = 0.0
        self.running = 0
        self.max_running = 0
        self.omit_logprobs = False
        self.max_in_flight = 0
        self.generate_attempts = 0
        self.bodies: list[GenerateReqInput] = []
        self.calls: list[tuple[str, str, dict]] = []
        self._in_flight = 0
        self._lock = threading.Lock()
        self._model_lock = threading.Lock()
        self._rng = torch.Generator().manual_seed(0)
        self.connections: set[socket.socket] = set()
        self.httpd = _HTTPServer((host, port), _handler_for(self))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f'http://{host}:{port}'

    def start(self) -> 'LMDeployProtocolDouble':
        """Serves from a daemon thread."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops serving: closes the listening socket and every open connection."""
        self.httpd.shutdown()
        self.httpd.server_close()
        for conn in list(self.connections):  # kept-alive connections would go on serving
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ------------------------------------------------------------------ routes
    def route(self, method: str, path: str, query: dict, headers: Any, raw: bytes) -> Any:
        # LMDeploy's middlewares, outermost first: sleeping, then API keys
        if (method, path) == ('POST', '/generate') and self.sleeping_tags:
            raise _error(HTTPStatus.SERVICE_UNAVAILABLE, 'Engine is sleeping; call POST /wakeup '
                         'before inference (e.g. tags=weights&tags=kv_cache).')
        if self.api_keys and not path.startswith('/health') and \
                headers.get('authorization', '') not in {f'Bearer {k}' for k in self.api_keys}:
            raise _error(HTTPStatus.UNAUTHORIZED, 'Unauthorized.')
        if method == 'GET' and path == '/health':
            if time.monotonic() - self._health[1] >= self.health_poll_s:  # the next probe
                live = 'sleeping' if self.sleeping_tags else 'healthy'
                self._health = (live, time.monotonic())
            status = self._health[0]
            return {'status': status, 'message': f'Engine is {status}.'}
        if method == 'GET' and path == '/is_sleeping':
            return {'is_sleeping': bool(self.sleeping_tags)}
        if method == 'GET' and path == '/v1/models':
            return {'object': 'list', 'data': [{'id': 'double', 'object': 'model'}]}
        if method != 'POST':
            raise _error(HTTPStatus.NOT_FOUND, f'no route {method} {path}')
        # LMDeploy's validate_json_request dependency on every POST route used here.
        if headers.get('content-type', '').split(';')[0].strip().lower() != 'application/json':
            raise _error(HTTPStatus.BAD_REQUEST,
                         "Unsupported Media Type: Only 'application/json' is allowed")
        self.calls.append((method, path, query))
        body = json.loads(raw) if raw else None
        routes = {'/generate': self.generate, '/sleep': self.sleep, '/wakeup': self.wakeup,
                  '/update_weights': self.update_weights,
                  '/init_weights_update_group': self.init_group,
                  '/update_weights_from_distributed': self.update_from_distributed,
                  '/destroy_weights_update_group': self.destroy_group}
        if path not in routes:
            raise _error(HTTPStatus.NOT_FOUND, f'no route {method} {path}')
        return routes[path](body, query)

    @staticmethod
    def _validate(model: type[pydantic.BaseModel], body: Any) -> Any:
        try:
            return model.model_validate(body)
        except pydantic.ValidationError as e:  # LMDeploy's validation_exception_handler
            first = e.errors()[0]
            where = '.'.join(str(p) for p in first.get('loc', ()))
            raise _error(HTTPStatus.BAD_REQUEST,
                         f"{where}: {first['msg']}" if where else first['msg']) from None

    def generate(self, body: Any, query: dict) -> dict:
        with self._lock:
            self.generate_attempts += 1
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            fail = self.fail_next.pop(0) if self.fail_next else None
        try:
            if self.delay_s:
                time.sleep(self.delay_s)
            if fail is not None:
                raise _error(fail, f'injected failure {fail}')
            req = self._validate(GenerateReqInput, body)
            self.bodies.append(req)
            self._check(req)
            with self._slots:  # the request-handle pool
                with self._lock:
                    self.running += 1
                    self.max_running = max(self.max_running, self.running)
                try:
                    return self._generate(req)
                finally:
                    with self._lock:
                        self.running -= 1
        finally:
            with self._lock:
                self._in_flight -= 1

    def _check(self, req: GenerateReqInput) -> None:
        """LMDeploy's request checks (``endpoints/generate.py``) that apply here."""
        if req.return_logprob and self.logprobs_mode is None:
            raise _error(HTTPStatus.BAD_REQUEST,
                         f'return_logprob({req.return_logprob}) requested but not enabled '
                         'logprobs_mode in engine configuration.')
        if req.prompt is not None or req.input_ids is None:
            raise _error(HTTPStatus.BAD_REQUEST, 'this double takes input_ids only')
        if not req.input_ids:
            raise _error(HTTPStatus.BAD_REQUEST, 'The input_ids must not be an empty list')
        if len(req.input_ids) >= self.session_len:
            raise _error(HTTPStatus.BAD_REQUEST, f'Input length ({len(req.input_ids)}) must be '
                         f'smaller than the model context length ({self.session_len}).')
        if req.max_tokens < 0:
            raise _error(HTTPStatus.BAD_REQUEST, f'The max_tokens {req.max_tokens!r} must be '
                         'non-negative.')
        if req.logprob_start_len >= 0:
            if req.return_logprob is not True:
                raise _error(HTTPStatus.BAD_REQUEST,
                             'logprob_start_len requires return_logprob=True.')
            if req.max_tokens != 0:
                raise _error(HTTPStatus.BAD_REQUEST, 'logprob_start_len requires max_tokens=0.')
        elif req.max_tokens == 0:
            raise _error(HTTPStatus.BAD_REQUEST, f'The max_tokens {req.max_tokens!r} must be a '
                         'positive integer.')
        if req.top_p is not None and not 0 < req.top_p <= 1:
            raise _error(HTTPStatus.BAD_REQUEST, f'The top_p {req.top_p!r} must be in (0, 1].')
        if req.top_k is not None and req.top_k < 0:
            raise _error(HTTPStatus.BAD_REQUEST, f'The top_k {req.top_k!r} cannot be negative.')
        if req.temperature is not None and not 0 <= req.temperature <= 2:
            raise _error(HTTPStatus.BAD_REQUEST,
                         f'The temperature {req.temperature!r} must be in [0, 2]')
        images = req.image_data if isinstance(req.image_data, list) else [req.image_data]
        for img in filter(None, images):
            self._check_image(img)

    @staticmethod
    def _check_image(img: str | dict) -> None:
        """Inline images must decode (the tiny model ignores them)."""
        url = img['url'] if isinstance(img, dict) else img
        if url.startswith(('http://', 'https://')):
            return
        if not url.startswith('data:image/') or ';base64,' not in url:
            raise _error(HTTPStatus.BAD_REQUEST, f'unsupported image_data {url[:40]!r}')
        from PIL import Image
        try:
            Image.open(io.BytesIO(base64.b64decode(url.split(',', 1)[1]))).verify()
        except (binascii.Error, OSError) as e:
            raise _error(HTTPStatus.BAD_REQUEST, f'image_data does not decode: {e}') from e

    @torch.no_grad()
    def _generate(self, req: GenerateReqInput) -> dict:
        if req.logprob_start_len >= 0:  # scoring only: the input tokens' raw logprobs
            with self._model_lock:
                logits = self.model(input_ids=torch.tensor([req.input_ids])).logits[0, :-1]
            raw = torch.log_softmax(logits.float(), -1)
            rows = [(raw[i, t].item(), t) for i, t in enumerate(req.input_ids[1:])
                    if i >= req.logprob_start_len]
            meta = GenerateReqMetaOutput(prompt_tokens=len(req.input_ids), completion_tokens=0,
                                         finish_reason={'type': 'length'},
                                         input_token_logprobs=rows)
            return GenerateReqOutput(text='', output_ids=[], meta_info=meta).model_dump(
                mode='json')
        stops = set(req.stop_token_ids or self.stop_words or []) | self.eos_ids
        sent = req.model_dump(exclude_unset=True)
        cfg = {**self.gen_defaults, **{k: sent[k] for k in _SAMPLING_FIELDS
                                       if sent.get(k) is not None}}
        temperature = cfg.get('temperature', 1.0)
        top_k = 1 if temperature == 0 else cfg.get('top_k', 0)
        ids: list[int] = []
        logprobs: list[float] = []
        finish = 'length'
        epoch = self._epoch
        limit = min(req.max_tokens or self.session_len, self.session_len - len(req.input_ids))
        past, inputs = None, torch.tensor([req.input_ids])
        for _ in range(limit):
            if self.token_delay_s:
                time.sleep(self.token_delay_s)
            if self._epoch != epoch:
                finish = 'abort'
                break
            with self._model_lock:
                out = self.model(input_ids=inputs, past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits[0, -1].float()
                token = self._sample(logits, temperature, cfg.get('top_p', 1.0), top_k)
                ids.append(token)
                logprobs.append(torch.log_softmax(logits, -1)[token].item())
                if token in stops:
                    finish = 'stop'
                    break
                inputs = torch.tensor([[token]])
        if finish == 'stop' and not req.include_stop_str_in_output:
            ids, logprobs = ids[:-1], logprobs[:-1]
        pairs = list(zip(logprobs, ids))
        meta = GenerateReqMetaOutput(
            prompt_tokens=len(req.input_ids), completion_tokens=len(ids),
            finish_reason={'type': finish},
            output_token_logprobs=None if (self.omit_logprobs or not req.return_logprob)
            else pairs)
        return GenerateReqOutput(text='', output_ids=ids, meta_info=meta).model_dump(mode='json')

    def _sample(self, logits: torch.Tensor, temperature: float, top_p: float,
                top_k: int) -> int:
        if top_k == 1:
            return int(logits.argmax())
        scores = logits / temperature
        if top_k > 0:
            kth = torch.topk(scores, min(top_k, scores.numel())).values[-1]
            scores = scores.masked_fill(scores < kth, float('-inf'))
        probs = torch.softmax(scores, -1)
        if top_p < 1:
            sorted_p, order = probs.sort(descending=True)
            drop = sorted_p.cumsum(0) - sorted_p >= top_p
            probs[order[drop]] = 0
        with self._lock:
            return int(torch.multinomial(probs / probs.sum(), 1, generator=self._rng))

    # ------------------------------------------------------------- sleep/wake
    def sleep(self, body: Any, query: dict) -> None:
        level = query.get('level', ['1'])[0]
        if level not in ('1', '2'):
            raise _error(HTTPStatus.BAD_REQUEST, 'The "level" query parameter must be 1 or 2.')
        self.sleeping_tags = {'weights', 'kv_cache'}
        self._epoch += 1  # LMDeploy's stop_all_session: running requests end with 'abort'

    def wakeup(self, body: Any, query: dict) -> None:
        tags = query.get('tags') or sorted(self.sleeping_tags)
        if any(t not in self.sleeping_tags for t in tags):
            return  # LMDeploy only logs a warning
        self.sleeping_tags -= set(tags)

    # ------------------------------------------------------------ weight sync
    def _load(self, named: list[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        unknown = [n for n, _ in named if n not in params]
        if unknown:
            raise _error(HTTPStatus.BAD_REQUEST, f'unknown weights {unknown[:3]}')
        with self._model_lock, torch.no_grad():
            for name, t in named:
                params[name].copy_(t.to(params[name].dtype))

    def update_weights(self, body: Any, query: dict) -> Any:
        """CUDA-IPC tensors, rebuilt as LMDeploy's model agent rebuilds them."""
        from multiprocessing.reduction import ForkingPickler
        req = self._validate(UpdateParamsRequest, body)
        if req.load_format is not None or not isinstance(req.serialized_named_tensors, str):
            raise _error(HTTPStatus.BAD_REQUEST, 'this double takes one serialized string '
                         'without load_format')
        if not torch.cuda.is_available():
            raise RuntimeError('CUDA IPC handles can only be opened on a GPU')
        named = []
        for name, (rebuild, args) in ForkingPickler.loads(
                base64.b64decode(req.serialized_named_tensors)):
            args = list(args)
            args[6] = torch.cuda.current_device()  # the device index, as on the server
            named.append((name, rebuild(*args).clone().cpu()))
        self._load(named)
        return NULL

    def init_group(self, body: Any, query: dict) -> dict:
        from lmdeploy.utils import init_custom_process_group
        req = self._validate(InitWeightsUpdateGroupRequest, body)
        if req.group_name in self.groups:
            raise _Reply(HTTPStatus.BAD_REQUEST, {'success': False,
                                                  'message': f'group {req.group_name!r} exists'})
        self.groups[req.group_name] = init_custom_process_group(
            backend=req.backend, init_method=f'tcp://{req.master_address}:{req.master_port}',
            world_size=req.world_size, rank=req.rank_offset, group_name=req.group_name,
            timeout=timedelta(seconds=60))
        return {'success': True, 'message': 'Succeeded to initialize weights update group.'}

    def update_from_distributed(self, body: Any, query: dict) -> dict:
        import torch.distributed as dist
        req = self._validate(UpdateWeightsFromDistributedRequest, body)
        group = self.groups.get(req.group_name)
        if group is None:
            raise _Reply(HTTPStatus.BAD_REQUEST, {
                'success': False, 'message': f'group {req.group_name!r} not initialized'})
        if req.load_format is not None:
            raise _Reply(HTTPStatus.BAD_REQUEST, {
                'success': False, 'message': 'this double receives unflattened tensors'})
        device = 'cuda' if dist.get_backend(group) == 'nccl' else 'cpu'
        named = [(n, torch.empty(s, dtype=getattr(torch, d), device=device))
                 for n, d, s in zip(req.names, req.dtypes, req.shapes)]
        handles = [dist.broadcast(t, src=0, group=group, async_op=True) for _, t in named]
        for h in handles:
            h.wait()
        self._load([(n, t.cpu()) for n, t in named])
        return {'success': True, 'message': 'Succeeded to update parameter online.'}

    def destroy_group(self, body: Any, query: dict) -> dict:
        import torch.distributed as dist
        req = self._validate(DestroyWeightsUpdateGroupRequest, body)
        group = self.groups.pop(req.group_name, None)
        if group is None:
            raise _Reply(HTTPStatus.BAD_REQUEST, {
                'success': False, 'message': f'group {req.group_name!r} not initialized'})
        dist.destroy_process_group(group)
        return {'success': True, 'message': 'destroyed'}


def _handler_for(double: LMDeployProtocolDouble) -> type[BaseHTTPRequestHandler]:

    class Handler(BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'  # keep-alive, as uvicorn

        def setup(self) -> None:
            super().setup()
            double.connections.add(self.connection)

        def finish(self) -> None:
            double.connections.discard(self.connection)
            super().finish()

        def _serve(self, method: str) -> None:
            parts = urlsplit(self.path)
            raw = self.rfile.read(int(self.headers.get('Content-Length') or 0))
            try:
                status, body = HTTPStatus.OK, double.route(
                    method, parts.path, parse_qs(parts.query), self.headers, raw)
            except _Reply as r:
                status, body = r.status, r.body
            except Exception:  # noqa: BLE001 (as uvicorn/starlette: a bare-text 500)
                status, body = HTTPStatus.INTERNAL_SERVER_ERROR, 'Internal Server Error'
            data = b'' if body is None else b'null' if body is NULL else body.encode() \
                if isinstance(body, str) else json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header('Content-Type', 'text/plain; charset=utf-8'
                                 if isinstance(body, str) else 'application/json')
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (e.g. its timeout)

        def do_GET(self) -> None:
            self._serve('GET')

        def do_POST(self) -> None:
            self._serve('POST')

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('model_path')
    parser.add_argument('--server-name', default='127.0.0.1')
    parser.add_argument('--server-port', type=int, default=23333)
    parser.add_argument('--logprobs-mode', default=None, choices=['raw_logprobs'])
    parser.add_argument('--backend', default='pytorch')  # accepted, as LMDeploy's CLI
    parser.add_argument('--tp', type=int, default=1)
    parser.add_argument('--delay-s', type=float, default=0.0, help='test hook: delay_s')
    args = parser.parse_args()
    torch.set_num_threads(1)
    double = LMDeployProtocolDouble(args.model_path, args.server_name, args.server_port,
                                    args.logprobs_mode)
    double.delay_s = args.delay_s
    print(f'LMDeployProtocolDouble serving {args.model_path} at {double.url}', flush=True)
    double.httpd.serve_forever()


if __name__ == '__main__':
    main()
