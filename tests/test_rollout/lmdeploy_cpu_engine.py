"""LMDeploy 0.18's own API server on CPU, with a stand-in for its PyTorch engine.

:class:`LMDeployCPUServer` runs ``lmdeploy.serve.openai.api_server.serve()`` as shipped
(FastAPI routers, request validation and its error handler, the sleeping and API-key
middlewares, the health monitor, the merge of ``generation_config.json`` defaults, the
chat template's stop words, stop-token trimming, sessions and the request-handle pool of
``max_batch_size`` handles, uvicorn) in a thread of the test process, or as a process of
its own (``python -m tests.test_rollout.lmdeploy_cpu_engine MODEL --server-port P
--logprobs-mode raw_logprobs``, :func:`main`), e.g. for a weight-update group, whose two
ends cannot share a process. Only the engine
is replaced: ``serve()`` asks ``get_task`` for its ``AsyncEngine`` class and gets
:class:`CPUAsyncEngine`, whose ``_build_pytorch`` returns :class:`CPUEngine` (LMDeploy's
engine needs CUDA). The stand-in generates token by token with a Hugging Face causal LM
in float32, returns raw logprobs (``log_softmax`` of the unscaled logits, as
``--logprobs-mode raw_logprobs``), cancels on ``async_cancel`` (``/sleep`` aborts running
requests), scores given tokens as the PyTorch engine does for ``logprob_start_len``
(``max_new_tokens=0``: one forward pass, raw logprobs of the input tokens after the
boundary), and joins weight-update groups with LMDeploy's own
``init_custom_process_group`` (any torch backend: gloo on CPU). CUDA-IPC weights
(``/update_weights``) cannot be rebuilt without a GPU: the stand-in raises, as the real
engine does there.

Test hooks on :class:`CPUEngine`: ``token_delay_s`` (per generated token),
``failing`` (names of engine calls that raise while listed, e.g. ``'sleep'``),
``ignore_updates_file`` (while that file exists, a weight update is received and
answered as a success but not loaded: a reload that never reaches the weights; in a
server process of its own, set by ``GEPO_CPU_ENGINE_IGNORE_UPDATES_FILE``), and the
records ``max_running`` (requests generating at once) and ``requests``.
"""

import asyncio
import contextlib
import importlib
import os
import threading
import time
from datetime import timedelta
from typing import Any

import httpx
import torch
import uvicorn
from lmdeploy.messages import EngineOutput, PytorchEngineConfig, ResponseType, ScheduleMetrics
from lmdeploy.model import ChatTemplateConfig
from lmdeploy.serve.core import AsyncEngine, VLAsyncEngine
from lmdeploy.serve.openai import api_server
from transformers import AutoModelForCausalLM

from gepo_xtuner.rollout.server.process import free_port


class CPUEngine:
    """What ``AsyncEngine`` and the endpoints call on LMDeploy's PyTorch engine, on CPU.

    Args:
        model_path: a Hugging Face causal-LM directory (loaded in float32).
        engine_config: the server's ``PytorchEngineConfig`` (``logprobs_mode``,
            ``max_batch_size``); exposed as ``engine_config`` like the real engine's.
    """

    def __init__(self, model_path: str, engine_config: PytorchEngineConfig) -> None:
        self.vision = is_vision_language(model_path)
        if self.vision:  # the whole VLM; LMDeploy's own vision preprocessing feeds it
            from transformers import AutoModelForImageTextToText
            self.model = AutoModelForImageTextToText.from_pretrained(model_path,
                                                                     torch_dtype=torch.float32)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(model_path,
                                                              torch_dtype=torch.float32)
        self.model.eval()
        self.checkpoint_params = _checkpoint_params(self.model, model_path)
        if engine_config.max_batch_size is None:
            engine_config.max_batch_size = 8
        self.engine_config = engine_config
        self.token_delay_s = 0.0
        self.failing: set[str] = set()
        self.ignore_updates_file = os.environ.get('GEPO_CPU_ENGINE_IGNORE_UPDATES_FILE')
        self.requests: list[dict] = []
        self.running = 0
        self.max_running = 0
        self.tick = 0
        self.sleep_level: int | None = None
        self.groups: dict[str, Any] = {}
        self._cancelled: set[int] = set()
        self._model_lock = threading.Lock()

    def _maybe_fail(self, name: str) -> None:
        if name in self.failing:
            raise RuntimeError(f'injected engine failure in {name}')

    # -------------------------------------------------------------- generation
    def create_instance(self) -> 'CPUEngineInstance':
        return CPUEngineInstance(self)

    def _step(self, input_ids: list[int], past: Any, gen: torch.Generator, cfg: Any,
              seen: list[int], images: dict[str, torch.Tensor] | None = None
              ) -> tuple[int, dict[int, float], Any]:
        """One decoding step: (token, {token: raw logprob, top-k...}, past); ``images``:
        the pixel tensors of the prompt's images, on the prefill step."""
        with self._model_lock, torch.no_grad():
            out = self.model(input_ids=torch.tensor([input_ids]), past_key_values=past,
                             use_cache=True, **(images or {}))
        logits = out.logits[0, -1].float()
        raw = torch.log_softmax(logits, -1)
        scores = logits.clone()
        if cfg.repetition_penalty != 1.0 and seen:
            idx = torch.tensor(sorted(set(seen)))
            s = scores[idx]
            scores[idx] = torch.where(s > 0, s / cfg.repetition_penalty, s * cfg.repetition_penalty)
        top_k = 1 if cfg.temperature == 0 else cfg.top_k
        if top_k == 1:
            token = int(scores.argmax())
        else:
            scores = scores / cfg.temperature
            if top_k > 0:
                kth = torch.topk(scores, min(top_k, scores.numel())).values[-1]
                scores = scores.masked_fill(scores < kth, float('-inf'))
            probs = torch.softmax(scores, -1)
            if cfg.top_p < 1:
                sorted_p, order = probs.sort(descending=True)
                probs[order[sorted_p.cumsum(0) - sorted_p >= cfg.top_p]] = 0
            if cfg.min_p > 0:
                probs[probs < cfg.min_p * probs.max()] = 0
            token = int(torch.multinomial(probs / probs.sum(), 1, generator=gen))
        logprobs = {token: float(raw[token])}
        if cfg.logprobs:
            values, ids = raw.topk(cfg.logprobs)
            logprobs.update({int(i): float(v) for v, i in zip(values, ids)})
        return token, logprobs, out.past_key_values

    def _images(self, input_ids: list[int], multimodal: Any) -> dict[str, torch.Tensor] | None:
        """The model's pixel inputs from what LMDeploy's vision preprocessing produced (one
        item per image: ``pixel_values``, ``offset``, ``image_tokens``, ``image_token_id``),
        after checking that each item's image tokens sit at its offset in ``input_ids``, as
        the PyTorch engine's input processor places the image features there."""
        if not multimodal:
            return None
        if not self.vision:
            raise RuntimeError('images sent to a text model')
        items = self._items(multimodal)
        extra = {k for item in items for k in item} - {
            'pixel_values', 'offset', 'image_tokens', 'image_token_id'}
        if extra:  # e.g. Qwen2-VL's image_grid_thw and M-RoPE positions: not modelled here
            raise RuntimeError(f'the stand-in feeds InternVL-style pixel tiles only, got {extra}')
        for item in items:
            start, n = int(item['offset']), int(item['image_tokens'])
            span = input_ids[start:start + n]
            if span != [int(item['image_token_id'])] * n:
                raise RuntimeError(f'image tokens expected at {start}..{start + n}, found {span[:8]}')
        return {'pixel_values': torch.cat([item['pixel_values'].float() for item in items])}

    @staticmethod
    def _items(multimodal: Any) -> list[dict]:
        return list(multimodal['image'] if isinstance(multimodal, dict) else multimodal)

    def _score(self, input_ids: list[int], start: int,
               images: dict[str, torch.Tensor] | None) -> list[dict[int, float]]:
        """Raw logprobs of ``input_ids[start + 1:]``, one ``{token: logprob}`` per token
        (the input-logprob rows of the PyTorch engine, ``logprobs_mode`` raw_logprobs)."""
        with self._model_lock, torch.no_grad():
            logits = self.model(input_ids=torch.tensor([input_ids]), **(images or {})).logits
        raw = torch.log_softmax(logits[0, :-1].float(), -1)
        return [{int(t): float(raw[i, t])} for i, t in enumerate(input_ids[1:]) if i >= start]

    async def generate(self, session_id: int, input_ids: list[int], gen_config: Any,
                       multimodal: Any = None):
        images = self._images(list(input_ids), multimodal)
        self.requests.append({'input_ids': list(input_ids), 'gen_config': gen_config,
                              'images': 0 if images is None else len(self._items(multimodal))})
        if gen_config.logprob_start_len >= 0:  # scoring only (AsyncEngine checked the rest)
            rows = await asyncio.to_thread(self._score, list(input_ids),
                                           gen_config.logprob_start_len, images)
            self.tick += 1
            yield EngineOutput(ResponseType.FINISH, [], logprobs=rows)
            return
        stops = set() if gen_config.ignore_eos else set(gen_config.stop_token_ids or [])
        limit = min(gen_config.max_new_tokens,
                    self.engine_config.session_len - len(input_ids))
        gen = torch.Generator().manual_seed(gen_config.random_seed or 0)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            past, feed, seen = None, list(input_ids), []
            for t in range(limit):
                if session_id in self._cancelled:
                    self._cancelled.discard(session_id)
                    yield EngineOutput(ResponseType.CANCEL, [])
                    return
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                token, logprobs, past = await asyncio.to_thread(
                    self._step, feed, past, gen, gen_config, seen, images if t == 0 else None)
                self.tick += 1
                seen.append(token)
                feed = [token]
                last = (token in stops and t + 1 >= (gen_config.min_new_tokens or 0)) or t + 1 == limit
                yield EngineOutput(ResponseType.FINISH if last else ResponseType.SUCCESS,
                                   [token], logprobs=[logprobs])
                if last:
                    return
        finally:
            self.running -= 1
            self._cancelled.discard(session_id)

    async def get_health_status(self) -> dict:
        return {'alive': True, 'message': '',
                'schedule_metrics': ScheduleMetrics(active_seqs=self.running,
                                                    scheduler_tick=self.tick)}

    def get_schedule_metrics(self) -> ScheduleMetrics:
        return ScheduleMetrics(active_seqs=self.running, scheduler_tick=self.tick)

    # ------------------------------------------------------------- sleep/wake
    async def sleep(self, level: int = 1) -> None:
        self._maybe_fail('sleep')
        self.sleep_level = level

    def wakeup(self, tags: list[str] | None = None) -> None:
        self._maybe_fail('wakeup')
        if tags is None or 'kv_cache' in tags:
            self.sleep_level = None

    # ------------------------------------------------------------ weight sync
    def update_params(self, request: Any) -> None:
        """CUDA-IPC weights: rebuilding CUDA tensors needs a GPU."""
        self._maybe_fail('update_params')
        raise RuntimeError('CUDA IPC handles can only be opened on a GPU')

    def complete_weights_update(self) -> None:
        pass

    async def init_weights_update_group(self, request: Any) -> tuple[bool, str]:
        from lmdeploy.utils import init_custom_process_group
        self._maybe_fail('init_weights_update_group')
        if request.group_name in self.groups:
            return False, f'weights update group {request.group_name!r} already exists'
        self.groups[request.group_name] = await asyncio.to_thread(
            init_custom_process_group, backend=request.backend,
            init_method=f'tcp://{request.master_address}:{request.master_port}',
            world_size=request.world_size, rank=request.rank_offset,
            group_name=request.group_name, timeout=timedelta(seconds=60))
        return True, 'Succeeded to initialize weights update group.'

    async def update_weights_from_distributed(self, request: Any) -> tuple[bool, str]:
        import torch.distributed as dist
        self._maybe_fail('update_weights_from_distributed')
        group = self.groups.get(request.group_name)
        if group is None:
            return False, f'weights update group {request.group_name!r} is not initialized'
        named = [(n, torch.empty(s, dtype=getattr(torch, d)))
                 for n, d, s in zip(request.names, request.dtypes, request.shapes)]

        def receive() -> None:
            for _, t in named:
                dist.broadcast(t, src=0, group=group)
        await asyncio.to_thread(receive)
        unknown = [name for name, _ in named if name not in self.checkpoint_params]
        if unknown:  # LMDeploy's loader looks tensors up by their checkpoint names
            return False, f'no parameter named {unknown[:3]} in the checkpoint'
        if self.ignore_updates_file and os.path.exists(self.ignore_updates_file):
            return True, 'Succeeded to update parameter online.'  # and loaded nothing
        with self._model_lock, torch.no_grad():
            for name, t in named:
                self.checkpoint_params[name].copy_(t)
        return True, 'Succeeded to update parameter online.'

    async def destroy_weights_update_group(self, request: Any) -> tuple[bool, str]:
        import torch.distributed as dist
        group = self.groups.pop(request.group_name, None)
        if group is None:
            return False, f'weights update group {request.group_name!r} is not initialized'
        dist.destroy_process_group(group)
        return True, 'Destroyed weights update group.'

    async def get_checkpoint_engine_status(self) -> list[dict]:
        """One entry per tensor-parallel rank, as the engine's workers answer (the
        checkpoint-engine receiver itself needs CUDA: never ready here)."""
        return [{'rank': r, 'device_uuid': f'CPU-{r}', 'ready': False,
                 'message': 'checkpoint-engine IPC needs CUDA', 'checkpoint_engine_version': None}
                for r in range(self.engine_config.tp)]

    def end_session(self, session_id: int) -> bool:
        return True

    def close(self) -> None:
        pass


class CPUEngineInstance:
    """A request handle of the pool (``AsyncEngine`` makes ``max_batch_size`` of them)."""

    def __init__(self, engine: CPUEngine) -> None:
        self.engine = engine

    async def async_stream_infer(self, session_id: int, input_ids: list[int], gen_config: Any,
                                 multimodal: Any = None, adapter_name: str | None = None,
                                 **kwargs: Any):
        async for out in self.engine.generate(session_id, input_ids, gen_config, multimodal):
            yield out

    async def async_cancel(self, session_id: int) -> None:
        self.engine._cancelled.add(session_id)


class CPUAsyncEngine(AsyncEngine):
    """LMDeploy's ``AsyncEngine`` with :class:`CPUEngine` in place of the PyTorch engine."""

    def _build_pytorch(self, model_path: str, backend_config: PytorchEngineConfig | None = None,
                       **kwargs: Any) -> CPUEngine:
        return CPUEngine(model_path, backend_config)


class CPUVLAsyncEngine(VLAsyncEngine):
    """LMDeploy's ``VLAsyncEngine`` (its ``ImageEncoder``: the model's vision
    preprocessing, run on CPU as shipped) with :class:`CPUEngine` in place of the PyTorch
    engine."""

    def _build_pytorch(self, model_path: str, backend_config: PytorchEngineConfig | None = None,
                       **kwargs: Any) -> CPUEngine:
        return CPUEngine(model_path, backend_config)


def is_vision_language(model_path: str) -> bool:
    """LMDeploy's own test (``check_vl_llm`` on the model's config), as ``get_task`` does."""
    from lmdeploy.archs import check_vl_llm, get_model_arch
    _, config = get_model_arch(model_path)
    return bool(check_vl_llm('pytorch', config.to_dict()))


def engine_task(model_path: str, text: type = None, vision: type = None) -> tuple[str, type]:
    """``get_task`` with the stand-ins: a VLM gets LMDeploy's VL engine over :class:`CPUEngine`."""
    if is_vision_language(model_path):
        return 'vlm', vision or CPUVLAsyncEngine
    return 'llm', text or CPUAsyncEngine


def _checkpoint_params(model: Any, model_path: str) -> dict[str, torch.Tensor]:
    """Checkpoint name -> the loaded model's parameter, as an engine's loader finds tensors:
    by the names in the checkpoint files. transformers renames some VLM modules at load
    (InternVL's ``language_model.model.X`` is ``model.language_model.X`` in the module
    tree), so the names are read from what the model's own ``save_pretrained`` writes:
    each parameter is filled with its index, saved to a scratch directory, and every
    saved tensor names the parameter whose index it holds; then the weights are put back."""
    import tempfile

    from safetensors.torch import load_file
    params = [p for _, p in model.named_parameters()]
    kept = [p.detach().clone() for p in params]
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad(), tempfile.TemporaryDirectory() as scratch:
        for i, p in enumerate(params):
            p.fill_(float(i))
        model.save_pretrained(scratch, safe_serialization=True)
        for path in sorted(os.listdir(scratch)):
            if path.endswith('.safetensors'):
                for key, value in load_file(os.path.join(scratch, path)).items():
                    out[key] = params[int(value.flatten()[0])]
        for p, value in zip(params, kept):
            p.copy_(value)
    return out


_START_LOCK = threading.Lock()


class LMDeployCPUServer:
    """``lmdeploy serve api_server`` (LMDeploy's ``serve()``) on a free local port, in a thread.

    Args:
        model_path: the model directory the server loads (tokenizer, config,
            ``generation_config.json``).
        logprobs_mode: ``--logprobs-mode`` (``None``: not given).
        max_batch_size: ``--max-batch-size``, the size of the request-handle pool.
        api_keys: ``--api-keys``.
        stop_words: the chat template's stop words (a named template's ``stop_words``,
            via ``ChatTemplateConfig('base', stop_words=...)``); ``None``: the model's own.
        session_len: ``--session-len``.
        tp: ``--tp`` (the stand-in reports that many engine workers).
        env: environment variables set while the server starts (e.g. the health
            monitor's ``LMDEPLOY_HEALTH_POLL_INTERVAL``).
        enable_abort_handling: ``--enable-abort-handling`` (``POST /abort_request``), which
            the backend's launch command gives LMDeploy's server (default True).
    """

    def __init__(self, model_path: str, logprobs_mode: str | None = 'raw_logprobs',
                 max_batch_size: int = 8, api_keys: list[str] | None = None,
                 stop_words: list[str] | None = None, session_len: int | None = None,
                 tp: int = 1, env: dict[str, str] | None = None,
                 enable_abort_handling: bool = True) -> None:
        self.model_path = str(model_path)
        self.enable_abort_handling = enable_abort_handling
        self.port = free_port()
        self.url = f'http://127.0.0.1:{self.port}'
        self.config = PytorchEngineConfig(logprobs_mode=logprobs_mode,
                                          max_batch_size=max_batch_size,
                                          session_len=session_len, tp=tp, enable_metrics=False)
        self.api_keys = api_keys
        self.chat_template = None if stop_words is None else ChatTemplateConfig(
            'base', stop_words=stop_words)
        self.env = {'UVICORN_LOG_LEVEL': 'warning', **(env or {})}
        self.uvicorn: uvicorn.Server | None = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._async_engine: CPUAsyncEngine | None = None

    @property
    def async_engine(self) -> CPUAsyncEngine:
        return self._async_engine

    @property
    def engine(self) -> CPUEngine:
        return self._async_engine.engine

    def start(self, timeout_s: float = 60.0) -> 'LMDeployCPUServer':
        """Starts serving and returns once ``GET /health`` answers 200."""
        server = self
        ready = threading.Event()

        class Engine(CPUAsyncEngine):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                server._async_engine = self

        class VLEngine(CPUVLAsyncEngine):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                server._async_engine = self

        class Server(uvicorn.Server):  # records itself, so stop() can end it
            def __init__(self, config: uvicorn.Config) -> None:
                super().__init__(config)
                server.uvicorn = self
                ready.set()

        def run() -> None:
            try:
                api_server.serve(self.model_path, backend='pytorch', backend_config=self.config,
                                 chat_template_config=self.chat_template, server_name='127.0.0.1',
                                 server_port=self.port, api_keys=self.api_keys, log_level='ERROR',
                                 enable_abort_handling=self.enable_abort_handling)
            except BaseException as e:  # noqa: BLE001 (reported by start())
                self.error = e
                ready.set()

        task = engine_task(self.model_path, Engine, VLEngine)
        with _START_LOCK, _patched(api_server, 'get_task', lambda *a, **k: task), \
                _patched(importlib.import_module('uvicorn.main'), 'Server', Server), _env(self.env):
            self._thread = threading.Thread(target=run, daemon=True, name='lmdeploy-api-server')
            self._thread.start()
            ready.wait(timeout_s)
            self._wait_healthy(timeout_s)
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.error is not None:
                raise RuntimeError(f'LMDeploy serve() failed: {self.error!r}') from self.error
            try:
                if httpx.get(f'{self.url}/health', timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f'LMDeploy serve() at {self.url} not healthy after {timeout_s} s')

    def stop(self) -> None:
        """Shuts uvicorn down (the app's lifespan closes the engine) and joins the thread."""
        if self.uvicorn is not None:
            self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def _env(values: dict[str, str]):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v



def main() -> None:
    """``lmdeploy serve api_server`` with the CPU stand-in engine, as a process of its own
    (the flags of LMDeploy's CLI that the tests use). SIGTERM stops it as it stops
    LMDeploy's server (uvicorn's shutdown, then the app's lifespan)."""
    import argparse
    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument('model_path')
    parser.add_argument('--server-name', default='127.0.0.1')
    parser.add_argument('--server-port', type=int, default=23333)
    parser.add_argument('--backend', default='pytorch', choices=['pytorch'])
    parser.add_argument('--tp', type=int, default=1)
    parser.add_argument('--max-batch-size', type=int, default=8)
    parser.add_argument('--logprobs-mode', default=None, choices=['raw_logprobs', 'raw_logits'])
    parser.add_argument('--api-keys', nargs='*', default=None)
    parser.add_argument('--enable-abort-handling', action='store_true')
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault('UVICORN_LOG_LEVEL', 'warning')
    config = PytorchEngineConfig(logprobs_mode=args.logprobs_mode, tp=args.tp,
                                 max_batch_size=args.max_batch_size, enable_metrics=False)
    task = engine_task(args.model_path)
    api_server.get_task = lambda *a, **k: task
    print(f'LMDeploy api_server (CPU stand-in engine) serving {args.model_path}', flush=True)
    api_server.serve(args.model_path, backend='pytorch', backend_config=config,
                     server_name=args.server_name, server_port=args.server_port,
                     api_keys=args.api_keys, log_level='ERROR',
                     enable_abort_handling=args.enable_abort_handling)


if __name__ == '__main__':
    main()
