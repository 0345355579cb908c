"""LMDeploy's token-in/token-out ``POST /generate`` protocol: request bodies and responses.

Pure functions (no network), checked in the tests against LMDeploy's own pydantic
models (``GenerateReqInput``, ``GenerateReqOutput`` in
``lmdeploy.serve.openai.protocol``, LMDeploy 0.18). What the server does with them,
read from ``lmdeploy/serve/openai/endpoints/generate.py`` and
``lmdeploy/serve/core/async_engine.py``:

* ``return_logprob=True`` needs a server started with ``--logprobs-mode raw_logprobs``
  (otherwise it answers 400); each generated token then comes back as
  ``meta_info.output_token_logprobs[t] == [logprob, token_id]``, the log-softmax of
  the raw logits (before temperature / top-p / top-k).
* A generated stop token is cut from ``output_ids`` unless
  ``include_stop_str_in_output=True``; we always set it, because the policy must learn
  to emit the stop token, so it and its logprob have to be in the response.
* Unset sampling fields fall back to the model's ``generation_config.json`` (e.g. a
  ``repetition_penalty`` of 1.05); every field that changes the distribution is sent
  explicitly, so the server samples from exactly the policy the trainer scores.
* Stop tokens: a request without ``stop_token_ids`` stops at the chat template's stop
  words (e.g. ``<|im_end|>`` of a named template, the tokenizer's ``eot_token``) and
  the EOS ids of the tokenizer and of ``generation_config.json``. A request with
  ``stop_token_ids`` stops at those and the same EOS ids: they *replace* the template's
  stop words (``AsyncEngine._determine_gen_config``). So ids the server adds anyway
  are not sent, and a request whose stop ids are all among them sends none.
* ``logprob_start_len=0`` with ``max_tokens=0`` (and ``return_logprob=True``) scores the
  given ``input_ids`` instead of generating (the weight-push probe): each token after the
  first comes back as ``meta_info.input_token_logprobs[t - 1] == [logprob, token_id]``.
  The PyTorch engine answers it (not TurboMind, nor with speculative decoding: 400).
* ``temperature=0`` is greedy decoding (the server turns it into ``top_k=1``);
  ``top_k=0`` disables top-k. The server has no ``n`` and no seed for this endpoint:
  K responses are K requests, and sampling is not reproducible across runs.
"""

import base64
import io
import mimetypes
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..base import RolloutRequest, RolloutSample, SamplingParams

# Fields the backend relies on; a request's ``extra`` may not change them.
RESERVED_FIELDS: frozenset[str] = frozenset(
    {'input_ids', 'prompt', 'image_data', 'return_logprob', 'include_stop_str_in_output',
     'stream'})
LOGPROBS_HINT = ('start the server with `--logprobs-mode raw_logprobs` (LMDeploy returns '
                 'per-token logprobs only in that mode)')
# Positive log-probabilities beyond rounding mean the server returned logits.
_MAX_LOGPROB = 1e-3


class LMDeployProtocolError(RuntimeError):
    """The server answered, but not with what the protocol promises."""


def build_generate_payload(request: RolloutRequest, params: SamplingParams,
                           server_stops: Collection[int] = ()) -> dict[str, Any]:
    """The JSON body of one ``POST /generate`` (one response to one prompt).

    Args:
        request: the prompt; ``input_ids`` is
            :meth:`~gepo_xtuner.rollout.RolloutRequest.collapsed_prompt_ids`: with
            images, the trainer's expanded prompt with each run of the image token cut
            to one, which LMDeploy's vision preprocessing (``to_pytorch_with_input_ids``)
            expands back to the image's feature count, markers such as InternVL's
            ``<img>`` / ``</img>`` kept where the processor wrote them.
            ``request.images`` become ``image_data`` (see :func:`encode_image`), and
            ``request.extra`` is merged into the body last (any other
            ``GenerateReqInput`` field, e.g. ``mm_processor_kwargs``).
        params: sampling settings; ``params.n`` is ignored here (one body per response).
        server_stops: ids the server stops at without being asked (the EOS ids of the
            model's tokenizer and ``generation_config.json``). When every id of
            ``params.stop_token_ids`` is one of them, ``stop_token_ids`` is left out,
            which keeps the chat template's stop words in force (see the module doc).

    Raises:
        ValueError: temperature outside LMDeploy's [0, 2], an empty prompt, or an
            ``extra`` key that would override a field the backend relies on.
    """
    if not request.input_ids:
        raise ValueError('RolloutRequest.input_ids is empty; LMDeploy rejects empty prompts')
    if params.temperature > 2:
        raise ValueError(f'LMDeploy accepts temperature in [0, 2], got {params.temperature}; '
                         'lower sampling.temperature')
    payload: dict[str, Any] = {
        # with images: the trainer's expanded prompt, each run of image tokens cut to the
        # one token the engine expands again (its own prompt is then the trainer's)
        'input_ids': [int(t) for t in request.collapsed_prompt_ids()],
        'max_tokens': params.max_new_tokens,
        'temperature': params.temperature,
        'top_p': params.top_p,
        'top_k': params.top_k,
        'min_p': 0.0,
        'repetition_penalty': 1.0,
        'ignore_eos': False,
        'return_logprob': True,
        'include_stop_str_in_output': True,
        'stream': False,
    }
    if set(params.stop_token_ids) - set(server_stops):  # else the template's stop words stay
        payload['stop_token_ids'] = [int(t) for t in params.stop_token_ids]
    if request.images:
        payload['image_data'] = [encode_image(img) for img in request.images]
    clash = RESERVED_FIELDS.intersection(request.extra)
    if clash:
        raise ValueError(f'RolloutRequest.extra may not set {sorted(clash)}: the LMDeploy '
                         'backend sets these fields itself')
    payload.update(request.extra)
    return payload


def encode_image(image: Any) -> str | dict:
    """An image as LMDeploy's ``image_data`` takes it: a URL or a ``data:image/...`` URI.

    ``http(s)://`` and ``data:`` strings and dicts (``{'url': ..., 'options': ...}``)
    pass through; local paths are read here and sent inline, since the server may run
    on another machine; PIL images are sent as PNG.

    Raises:
        FileNotFoundError: a path that does not exist.
        TypeError: anything else.
    """
    if isinstance(image, Mapping):
        return dict(image)
    if isinstance(image, str) and image.startswith(('http://', 'https://', 'data:')):
        return image
    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        if not path.is_file():
            raise FileNotFoundError(f'image file not found: {path}')
        mime = mimetypes.guess_type(path.name)[0] or 'image/png'
        if not mime.startswith('image/'):
            raise ValueError(f'{path} does not look like an image (guessed type {mime})')
        return _data_uri(path.read_bytes(), mime)
    if hasattr(image, 'save') and hasattr(image, 'mode'):  # a PIL image, without importing PIL
        buf = io.BytesIO()
        image.save(buf, format='PNG')
        return _data_uri(buf.getvalue(), 'image/png')
    raise TypeError(f'cannot send an image of type {type(image).__name__}; pass a path, a URL, '
                    'a data URI or a PIL image')


def _data_uri(data: bytes, mime: str) -> str:
    return f'data:{mime};base64,{base64.b64encode(data).decode("ascii")}'


def parse_generate_response(body: Mapping[str, Any], partial: bool = False) -> RolloutSample:
    """A :class:`RolloutSample` from one non-streaming ``/generate`` response.

    Checks what training relies on: logprobs are present, are log-probabilities, and
    belong to ``output_ids`` token by token; the finish reason is ``stop`` or ``length``,
    or, with ``partial`` (the call may be cut short, ``RolloutBackend.preempt``),
    ``abort``: the tokens so far, possibly none.

    Raises:
        LMDeployProtocolError: with what was wrong and what to change on the server.
    """
    try:
        output_ids = [int(t) for t in body['output_ids']]
        meta = body['meta_info'] or {}
    except (KeyError, TypeError, ValueError) as e:
        raise LMDeployProtocolError(f'not a /generate response ({e!r}): {str(body)[:300]}') from e
    finish = (meta.get('finish_reason') or {}).get('type')
    cut = partial and finish == 'abort'
    if cut and not output_ids:
        return RolloutSample([], [], 'abort')
    if finish not in ('stop', 'length') and not cut:
        raise LMDeployProtocolError(
            f'generation ended with finish_reason {finish!r} instead of stop/length (abort: '
            'the server stopped the request, e.g. /sleep or /abort_request during generation; '
            'error: see the server log)')
    pairs = meta.get('output_token_logprobs')
    if pairs is None:
        raise LMDeployProtocolError(f'the response has no meta_info.output_token_logprobs; '
                                    f'{LOGPROBS_HINT}')
    logprobs = [float(p[0]) for p in pairs]
    ids = [int(p[1]) for p in pairs]
    if ids != output_ids:
        raise LMDeployProtocolError(
            f'logprob token ids {ids[:8]}... do not match output_ids {output_ids[:8]}... '
            f'({len(ids)} vs {len(output_ids)} tokens)')
    if not output_ids:
        raise LMDeployProtocolError('the server returned an empty response')
    if max(logprobs) > _MAX_LOGPROB:
        raise LMDeployProtocolError(
            f'the server returned positive "logprobs" (max {max(logprobs):.3g}): it runs with '
            f'--logprobs-mode raw_logits; {LOGPROBS_HINT}')
    return RolloutSample(response_ids=output_ids, logprobs=logprobs, finish_reason=finish)


def build_probe_payload(ids: Sequence[int]) -> dict[str, Any]:
    """The ``/generate`` body that scores ``ids`` under the server's weights and
    generates nothing."""
    return {'input_ids': [int(t) for t in ids], 'max_tokens': 0, 'return_logprob': True,
            'logprob_start_len': 0, 'stream': False}


def parse_probe(body: Any, ids: Sequence[int]) -> list[float]:
    """``log p(ids[t] | ids[:t])`` for ``t = 1..len(ids)-1`` from a probe answer.

    Raises:
        LMDeployProtocolError: no ``input_token_logprobs``, or entries that are not the
            probe's tokens.
    """
    try:
        pairs = body['meta_info']['input_token_logprobs']
    except (KeyError, TypeError):
        raise LMDeployProtocolError(f'no meta_info in the answer to the probe: '
                                    f'{str(body)[:300]}') from None
    if not isinstance(pairs, list):
        raise LMDeployProtocolError(
            'the answer to the probe (logprob_start_len=0, max_tokens=0) has no '
            'meta_info.input_token_logprobs: the server cannot score a given sequence '
            '(LMDeploy older than 0.18, or not its PyTorch engine)')
    tokens = [int(p[1]) for p in pairs]
    if tokens != [int(t) for t in ids[1:]]:
        raise LMDeployProtocolError(f'input_token_logprobs are for tokens {tokens[:8]}..., '
                                    f'the probe is {list(ids[1:9])}... ({len(tokens)} vs '
                                    f'{len(ids) - 1} tokens)')
    return [float(p[0]) for p in pairs]


def error_message(body: Any) -> str:
    """The human-readable part of an LMDeploy/FastAPI error body (or the raw text)."""
    if isinstance(body, Mapping):
        if isinstance(body.get('message'), str):
            return body['message']
        if 'detail' in body:  # FastAPI's validation errors (422)
            return str(body['detail'])
    return str(body)[:500]


def has_error_detail(body: Any) -> bool:
    """Whether an error body says what went wrong (LMDeploy's JSON envelope, FastAPI's
    ``detail``), unlike the bare ``Internal Server Error`` of an unhandled exception."""
    return isinstance(body, Mapping) and bool(body.get('message') or body.get('detail'))


def hint_for(message: str) -> str:
    """What to change on the server for a known error message, or ``''``."""
    if 'logprobs_mode' in message or 'logprob' in message.lower():
        return LOGPROBS_HINT
    if 'sleeping' in message.lower():
        return 'the engine is asleep: POST /wakeup (or restart the server) before generating'
    return ''


def group_samples(flat: Sequence[RolloutSample], n: int) -> list[list[RolloutSample]]:
    """Splits prompt-major flat samples into ``n`` per prompt."""
    return [list(flat[i:i + n]) for i in range(0, len(flat), n)]
