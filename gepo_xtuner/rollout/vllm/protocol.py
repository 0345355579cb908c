"""vLLM's OpenAI-compatible ``POST /v1/completions`` with token ids: request bodies and answers.

Pure functions (no network). What the server does with them, read from vLLM 0.32's
``vllm/entrypoints/openai/completion/protocol.py`` and checked against a running
``vllm serve`` in ``tests/test_vllm/test_server.py``:

* ``prompt`` may be a list of token ids; ``n`` responses to it come in one answer
  (``choices[i].index`` in ``0..n-1``), so a group is one request and never mixes
  servers or weight versions. ``prompt`` may also be a list of such lists: the answer
  holds ``n`` choices per prompt, numbered on from prompt to prompt (prompt ``i``'s
  response ``j`` is ``index = i * n + j``); every prompt gets the same sampling
  parameters, ``seed`` included.
* ``return_token_ids=true`` puts the generated ids in ``choices[i].token_ids``; a stop
  token that ended the response (EOS or one of ``stop_token_ids``) is among them, and
  ``finish_reason`` is ``'stop'``; ``'length'`` means ``max_tokens`` were generated.
* ``logprobs=0`` returns the sampled token's log-probability per generated token in
  ``choices[i].logprobs.token_logprobs``. Which distribution that is, is the server's
  ``--logprobs-mode``: ``raw_logprobs`` (vLLM's default) is ``log_softmax`` of the raw
  logits, before temperature, penalties, top-k and top-p, which is what
  :meth:`~gepo_xtuner.rollout.base.RolloutBackend.logprob_temperature` declares (1).
* Unset sampling fields take the model's ``generation_config.json`` defaults unless the
  server runs with ``--generation-config vllm``; every field that changes the
  distribution is sent, so the server samples exactly the policy the trainer scores.
* ``seed`` makes a request's samples reproducible; vLLM seeds its response ``j`` with
  ``seed + j`` (the backend spaces requests' seeds apart:
  :func:`~gepo_xtuner.rollout.vllm.backend.request_seed`).
* ``prompt_logprobs=0`` with ``max_tokens=1`` scores a fixed sequence (the weight-push
  probe): ``choices[0].prompt_logprobs[t]`` maps the token at ``t`` to its logprob
  (``None`` at ``t = 0``).
"""

from collections.abc import Sequence
from typing import Any

from ..base import RolloutRequest, RolloutSample, SamplingParams


#: fields of a request body that the backend sets and ``RolloutRequest.extra`` may not
RESERVED_FIELDS = frozenset({
    'model', 'prompt', 'n', 'max_tokens', 'temperature', 'top_p', 'top_k', 'min_p',
    'repetition_penalty', 'presence_penalty', 'frequency_penalty', 'logprobs',
    'return_token_ids', 'skip_special_tokens', 'stop_token_ids', 'seed', 'stream', 'echo',
    'best_of', 'use_beam_search', 'prompt_logprobs'})


class VLLMProtocolError(ValueError):
    """An answer that does not hold what was asked (the message says what is missing)."""


def build_completion_payload(model: str, request: RolloutRequest, params: SamplingParams,
                             seed: int | None) -> dict[str, Any]:
    """The ``/v1/completions`` body that samples ``params.n`` responses to ``request``.

    Args:
        model: the served model name (``GET /v1/models``).
        seed: the request's seed, or None for the server's random source.
    """
    return build_batch_payload(model, [request], params, seed)


def build_batch_payload(model: str, requests: Sequence[RolloutRequest], params: SamplingParams,
                        seed: int | None) -> dict[str, Any]:
    """The ``/v1/completions`` body that samples ``params.n`` responses to each of
    ``requests`` (one prompt: a flat list of ids; several: a list of such lists).

    Every prompt of one body shares its sampling fields, ``extra`` and ``seed`` (vLLM
    builds each prompt's sampling parameters from the same request), so the caller puts
    together only requests with equal ``extra``, and a seeded request goes alone.

    Args:
        model: the served model name (``GET /v1/models``).
        seed: the body's seed, or None for the server's random source.

    Raises:
        VLLMProtocolError: a request with images, ``extra`` fields the backend sets, or
            requests whose ``extra`` differ.
    """
    for request in requests:
        if request.images:
            raise VLLMProtocolError(
                'VLLMRolloutBackend sends token ids to /v1/completions, which takes no images; '
                "prompts with images go through LMDeployRolloutBackend (vLLM's token-in image "
                "API, /inference/v1/generate, is not wired up: docs/multimodal.md, 'vLLM')")
        reserved = sorted(RESERVED_FIELDS & set(request.extra))
        if reserved:
            raise VLLMProtocolError(f'RolloutRequest.extra may not set {reserved}: the backend '
                                    'sets them from the sampling settings')
    extra = requests[0].extra
    if any(r.extra != extra for r in requests[1:]):
        raise VLLMProtocolError('one /v1/completions body takes one set of extra fields; '
                                'requests with different RolloutRequest.extra go apart')
    prompts = [[int(t) for t in r.input_ids] for r in requests]
    payload: dict[str, Any] = {
        'model': model,
        'prompt': prompts[0] if len(prompts) == 1 else prompts,
        'n': params.n,
        'max_tokens': params.max_new_tokens,
        'temperature': params.temperature,
        'top_p': params.top_p if params.temperature > 0 else 1.0,
        'top_k': params.top_k if params.top_k > 0 and params.temperature > 0 else -1,
        'min_p': 0.0,
        'repetition_penalty': 1.0,
        'presence_penalty': 0.0,
        'frequency_penalty': 0.0,
        'logprobs': 0,
        'return_token_ids': True,
        'skip_special_tokens': False,
        'stop_token_ids': [int(t) for t in params.stop_token_ids],
        'ignore_eos': False,
    }
    if seed is not None:
        payload['seed'] = int(seed)
    payload.update(extra)
    return payload


def parse_completion(body: Any, params: SamplingParams) -> list[RolloutSample]:
    """The ``params.n`` samples of one single-prompt ``/v1/completions`` answer, in
    ``index`` order (:func:`parse_completions` with one prompt)."""
    return parse_completions(body, params, 1)[0]


def parse_completions(body: Any, params: SamplingParams, prompts: int, partial: bool = False
                      ) -> list[list[RolloutSample]]:
    """The groups of a ``/v1/completions`` answer to ``prompts`` prompts: group ``i`` holds
    the ``params.n`` samples of prompt ``i``.

    vLLM numbers the choices of a several-prompt answer on from prompt to prompt
    (``index = i * n + j``), so prompt ``i``'s response ``j`` is choice ``i * n + j``.

    Args:
        partial: the call may have been cut short (:meth:`VLLMRolloutBackend.preempt`):
            a choice ended with ``'abort'`` is a response so far, possibly empty.

    Raises:
        VLLMProtocolError: fewer or more choices than ``prompts * n``, a choice without
            token ids or logprobs, logprobs and ids of different lengths, a ``'length'``
            answer shorter than ``max_tokens``, an empty response, a null logprob, or an
            unknown ``finish_reason`` (``'abort'`` unless ``partial``): never a partial
            group by mistake.
    """
    choices = body.get('choices') if isinstance(body, dict) else None
    if not isinstance(choices, list):
        raise VLLMProtocolError(f'no "choices" list in the answer: {str(body)[:300]}')
    n, want = params.n, prompts * params.n
    order = sorted(choices, key=lambda c: c.get('index', -1) if isinstance(c, dict) else -1)
    if [c.get('index') if isinstance(c, dict) else None for c in order] != list(range(want)):
        got = sorted(c.get('index', -1) if isinstance(c, dict) else -1 for c in choices)
        asked = f'n={n} responses' if prompts == 1 else f'{prompts} prompts x n={n} responses'
        raise VLLMProtocolError(f'asked for {asked}, the answer has choices {got}')
    samples = []
    for choice in order:
        ids = choice.get('token_ids')
        logprobs = (choice.get('logprobs') or {}).get('token_logprobs')
        if not isinstance(ids, list) or not isinstance(logprobs, list):
            raise VLLMProtocolError(
                f'choice {choice["index"]} lacks token_ids or logprobs.token_logprobs (sent '
                'return_token_ids=true and logprobs=0; vLLM older than 0.10 ignores the first)')
        reason = choice.get('finish_reason')
        cut = partial and reason == 'abort'
        if len(ids) != len(logprobs) or not (ids or cut):
            raise VLLMProtocolError(f'choice {choice["index"]}: {len(ids)} token ids and '
                                    f'{len(logprobs)} logprobs')
        if reason == 'length' and len(ids) != params.max_new_tokens:
            raise VLLMProtocolError(f'choice {choice["index"]} ended for length after '
                                    f'{len(ids)} tokens, asked for {params.max_new_tokens}')
        if reason not in ('stop', 'length') and not cut:
            raise VLLMProtocolError(f'choice {choice["index"]} ended with finish_reason '
                                    f'{reason!r} (aborted or failed on the server)')
        if None in logprobs:
            raise VLLMProtocolError(f'choice {choice["index"]} has a null logprob')
        # map() converts in C, not a Python loop per token: the answer is already parsed
        # JSON, this only makes sure the types are int and float
        samples.append(RolloutSample(list(map(int, ids)), list(map(float, logprobs)), reason))
    return [samples[i * n:(i + 1) * n] for i in range(prompts)]


def merge_stream(events: Sequence[Any]) -> dict[str, Any]:
    """The chunks of a streamed ``/v1/completions`` answer (``stream: true``) as the one
    body a non-streamed answer would be: per choice ``index``, its ``token_ids`` and
    ``logprobs.token_logprobs`` concatenated in order, and its last non-null
    ``finish_reason`` (None if the stream ended without one).

    Raises:
        VLLMProtocolError: a chunk that is an error, or not a completion chunk.
    """
    choices: dict[int, dict[str, Any]] = {}
    for event in events:
        if not isinstance(event, dict) or not isinstance(event.get('choices'), list):
            raise VLLMProtocolError(f'a streamed chunk is not a completion: {str(event)[:300]}')
        for c in event['choices']:
            entry = choices.setdefault(c.get('index'), {
                'index': c.get('index'), 'token_ids': [],
                'logprobs': {'token_logprobs': []}, 'finish_reason': None})
            entry['token_ids'] += c.get('token_ids') or []
            entry['logprobs']['token_logprobs'] += (c.get('logprobs') or {}).get(
                'token_logprobs') or []
            if c.get('finish_reason') is not None:
                entry['finish_reason'] = c['finish_reason']
    return {'choices': list(choices.values())}


def fill_cut_choices(body: dict[str, Any], choices: int) -> dict[str, Any]:
    """A merged streamed answer (:func:`merge_stream`) of a call that a preemption cut,
    with every choice it lacks (index ``0..choices-1``) as a response cut before its first
    token, and every choice left without a ``finish_reason`` as cut.

    vLLM streams nothing for a response aborted before its first token (it leaves out
    empty chunks), so a request of ``n`` responses cut early answers with fewer choices,
    or none: those responses have no tokens and are continued whole.
    """
    have = {c.get('index'): c for c in body.get('choices', [])}
    out = []
    for i in range(choices):
        c = have.get(i) or {'index': i, 'token_ids': [], 'logprobs': {'token_logprobs': []},
                            'finish_reason': None}
        out.append(c if c.get('finish_reason') is not None else {**c, 'finish_reason': 'abort'})
    return {**body, 'choices': out + [c for k, c in have.items()
                                      if not isinstance(k, int) or not 0 <= k < choices]}


def build_probe_payload(model: str, ids: Sequence[int]) -> dict[str, Any]:
    """The body that scores ``ids`` under the server's weights (``prompt_logprobs``)."""
    return {'model': model, 'prompt': [int(t) for t in ids], 'max_tokens': 1,
            'temperature': 0.0, 'prompt_logprobs': 0, 'return_token_ids': True}


def parse_probe(body: Any, ids: Sequence[int]) -> list[float]:
    """``log p(ids[t] | ids[:t])`` for ``t = 1..len(ids)-1`` from a probe answer.

    Raises:
        VLLMProtocolError: no ``prompt_logprobs``, or one that misses a probe token.
    """
    try:
        table = body['choices'][0]['prompt_logprobs']
    except (KeyError, IndexError, TypeError):
        raise VLLMProtocolError(f'no prompt_logprobs in the answer: {str(body)[:300]}') from None
    if not isinstance(table, list) or len(table) != len(ids):
        raise VLLMProtocolError(f'prompt_logprobs has {len(table or [])} entries for '
                                f'{len(ids)} probe tokens')
    out = []
    for t in range(1, len(ids)):
        entry = (table[t] or {}).get(str(int(ids[t])))
        if not isinstance(entry, dict) or entry.get('logprob') is None:
            raise VLLMProtocolError(f'prompt_logprobs[{t}] lacks token {ids[t]}')
        out.append(float(entry['logprob']))
    return out
