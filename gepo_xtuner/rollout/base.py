"""The rollout-backend interface: prompts in, sampled token ids and logprobs out.

Backends differ in where generation runs (in the trainer process, or a remote
LMDeploy server), not in what they return, so the training loop never checks
which one it has.
"""

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn


@dataclass(frozen=True)
class SamplingParams:
    """How to sample responses.

    Attributes:
        n: responses per prompt (the group size K).
        temperature: softmax temperature; 0 means greedy decoding.
        top_p: nucleus sampling mass, in (0, 1].
        top_k: keep the k most likely tokens; 0 disables.
        max_new_tokens: response length cap.
        stop_token_ids: generation ends after any of these (it is kept in the
            response, so the policy learns to stop).
        seed: None (default): backends sample with their usual random source (the
            in-process backend: the global torch RNG, checkpointed by the loop). An int:
            the in-process backend samples from a private generator seeded with it and
            leaves the global RNG untouched, so generation on a background thread
            (``train_cfg.max_staleness``) is reproducible whatever the trainer draws
            meanwhile. Servers without a seed on their endpoint ignore it.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 32
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f'sampling n must be >= 1, got {self.n}')
        if self.temperature < 0:
            raise ValueError(f'sampling temperature must be >= 0, got {self.temperature}')
        if not 0 < self.top_p <= 1:
            raise ValueError(f'sampling top_p must be in (0, 1], got {self.top_p}')
        if self.top_k < 0 or self.max_new_tokens < 1:
            raise ValueError('sampling top_k must be >= 0 and max_new_tokens >= 1, got '
                             f'top_k={self.top_k}, max_new_tokens={self.max_new_tokens}')


@dataclass
class RolloutRequest:
    """One prompt to sample from.

    Attributes:
        input_ids: the tokenised prompt (chat template already applied); with
            images, the template's bare image placeholder once per image, the form
            an engine that writes the whole image block itself expands (vLLM's
            processors). LMDeploy's ``/generate`` takes :meth:`collapsed_prompt_ids`.
        images: optional images for multimodal backends (paths, URLs or PIL
            images), in prompt order.
        extra: backend-specific extras (passed through untouched; servers merge
            them into the request body).
        model_input_ids: for prompts with images, the prompt as the model itself
            takes it: the processor's ``input_ids`` with each image placeholder
            expanded to one token per image feature. ``None``: same as ``input_ids``.
        mm_inputs: for prompts with images, the processor's tensors for in-process
            backends (e.g. ``pixel_values``, ``image_grid_thw``), batched by
            concatenation along dim 0 (see :mod:`gepo_xtuner.ops.multimodal`).
            Never sent to servers.
        image_token_id: the id that ``model_input_ids`` repeats once per image feature
            (the processor's ``image_token``), for :meth:`collapsed_prompt_ids`.
    """

    input_ids: list[int]
    images: list[Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    model_input_ids: list[int] | None = None
    mm_inputs: dict[str, Tensor] | None = None
    image_token_id: int | None = None

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt's token ids as the policy model scores them (placeholders expanded)."""
        return self.input_ids if self.model_input_ids is None else self.model_input_ids

    def collapsed_prompt_ids(self) -> list[int]:
        """The prompt for an engine that expands each image token itself and writes nothing
        around it (LMDeploy's ``/generate``): :attr:`prompt_ids` with each run of
        :attr:`image_token_id` cut to one, so the engine's expansion is exactly the
        trainer's context, image markers included (InternVL / Intern-S1 write
        ``<img>`` and ``</img>`` around the run; Qwen2-VL's template already holds its
        markers, and the result equals :attr:`input_ids`). Prompts without images, or
        without an expanded form, give :attr:`input_ids`.

        Raises:
            ValueError: the runs do not match the images one to one, or the prompt was
                expanded but the request does not say by which token.
        """
        if not self.images or self.model_input_ids is None:
            return list(self.input_ids)
        if self.image_token_id is None:
            if list(self.model_input_ids) == list(self.input_ids):
                return list(self.input_ids)
            raise ValueError(
                'RolloutRequest.model_input_ids is expanded but image_token_id is not set: the '
                "engine's prompt cannot be rebuilt from it; set image_token_id to the "
                "processor's image token id (encode_request does)")
        from ..ops.multimodal import collapse_placeholder_runs
        return collapse_placeholder_runs(self.model_input_ids, self.image_token_id,
                                         len(self.images))


@dataclass
class RolloutSample:
    """One sampled response.

    Attributes:
        response_ids: generated token ids, including the stop token if one ended it.
        logprobs: per response token, its log-probability under the sampling
            policy's ``softmax(logits / t)``, where ``t`` is the backend's
            :meth:`RolloutBackend.logprob_temperature`: 1 by default, the raw model's
            distribution (LMDeploy's ``raw_logprobs`` mode); the sampling temperature for
            a backend that says it reports the distribution it sampled from (the
            in-process backend). Never top-p / top-k filtered.
        finish_reason: ``'stop'`` (a stop token) or ``'length'`` (hit the cap); from a
            generation cut short by :meth:`RolloutBackend.preempt`, ``'abort'`` (the tokens
            so far, possibly none).
        weight_version: the trainer's weight version the response was sampled with
            (RL steps whose update the rollout engine held), set by the RL loop; None
            where nobody labelled it (validation, tools). For a response continued across
            weight pushes (partial rollouts), the version of its first token.
        token_versions: for a response continued across weight pushes, the version that
            sampled each token (``len(response_ids)`` entries, non-decreasing); None: every
            token has ``weight_version``.
    """

    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_version: int | None = None
    token_versions: list[int] | None = None

    def versions(self) -> list[int | None]:
        """The weight version of each token: :attr:`token_versions`, else
        :attr:`weight_version` repeated."""
        if self.token_versions is not None:
            return list(self.token_versions)
        return [self.weight_version] * len(self.response_ids)


class RolloutBackend(abc.ABC):
    """Generates K responses per prompt and follows the trainer's weights.

    Contract (what the RL loop and the validator rely on; every backend of
    :data:`~gepo_xtuner.registry.ROLLOUT_BACKENDS` keeps it, and
    ``tests/test_rollout/test_conformance.py`` checks the in-process ones):

    * **Building is cheap and checks the arguments**: no network, no disk, no
      model; a bad argument raises ``ValueError`` naming it. Servers are reached
      or launched at :meth:`attach` or the first :meth:`generate`.
    * **Every data-parallel rank calls every method**, in the same order:
      :meth:`attach` once, then per step :meth:`generate` and
      :meth:`update_weights`, and :meth:`close` at the end. :meth:`generate` may
      be collective (a backend may synchronise ranks inside it), so a rank with
      nothing to sample still calls it, with zero requests, and gets ``[]``.
    * :meth:`generate` returns, for each request in order, ``params.n`` samples;
      each sample's ``logprobs`` has one entry per response token, and a
      response ends at the first stop token (kept) or at ``params.max_new_tokens``.
    * :meth:`update_weights` gets the unwrapped policy model (``nn.Module``, Hugging
      Face parameter names, full unsharded tensors on the rank that pushes them);
      when it returns on every rank, the next :meth:`generate` samples from
      those weights.
    * Anything that changes during training and matters for a resumed run (e.g.
      a counter that names weight files) is in :meth:`state_dict`; the loop
      checkpoints it.
    """

    #: whether :meth:`generate` may run on several threads at once (``train_cfg.
    #: groups_in_flight > 1``); False by default
    concurrent_generate: bool = False
    #: whether :meth:`generate` sends one engine request per response (``n`` per prompt),
    #: which the streaming stage counts against :meth:`request_slots`
    request_per_response: bool = False

    def attach(self, model: nn.Module, tokenizer: Any) -> None:
        """Called once by the loop with the (unwrapped) policy and its tokenizer."""

    @abc.abstractmethod
    def generate(self, requests: Sequence[RolloutRequest], params: SamplingParams
                 ) -> list[list[RolloutSample]]:
        """Samples ``params.n`` responses for each request (collective: see the class).

        Returns:
            ``result[i][j]`` is the j-th response to ``requests[i]``.
        """

    def update_weights(self, model: nn.Module) -> None:
        """Makes the backend sample from ``model``'s current weights (every rank calls it)."""

    def logprob_temperature(self, params: SamplingParams) -> float:
        """The temperature ``t`` of the distribution ``softmax(logits / t)`` whose
        log-probabilities :meth:`generate` returns for ``params``.

        The trainer scores responses under ``softmax(logits / params.temperature)``
        (the distribution sampled); where ``t`` differs, the rollout's logprobs are not
        the sampling policy's and cannot serve as behaviour logprobs (off-policy
        correction, ``entropy_logprobs='behaviour'``) or be compared with the trainer's
        (``rollout/logprob_abs_diff``): see
        :func:`~gepo_xtuner.engine.step.update.behaviour_refusal`.
        The default, 1, is the raw model's distribution (what an inference server
        reports unless told otherwise); a backend that reports the tempered
        distribution it sampled from says so by overriding this.
        """
        return 1.0

    def overlap_refusal(self) -> str | None:
        """Why this backend cannot generate on a background thread while the trainer
        updates the policy (``train_cfg.max_staleness >= 1``), or None when it can.

        A backend that can overlap keeps :meth:`generate` free of collectives and of the
        trainer's module: the loop calls it from a worker thread while the main thread
        trains, and never calls :meth:`update_weights` while it runs. The default
        refuses: a backend says it can.
        """
        return (f'{type(self).__name__} does not say it can generate while the trainer '
                'updates (RolloutBackend.overlap_refusal)')

    def prepare_overlap(self) -> None:
        """Called once after :meth:`attach` when the loop will overlap generation with
        training (e.g. the in-process backend takes its own copy of the weights).

        Raises:
            ValueError: the reason of :meth:`overlap_refusal`, when it has one.
        """
        self.check_overlap()

    def check_overlap(self) -> None:
        """Refuses ``train_cfg.max_staleness >= 1`` with this backend when it cannot
        overlap (the one wording of that refusal: the loop, its settings and
        ``tools/check_config.py`` all come here).

        Raises:
            ValueError: the reason of :meth:`overlap_refusal`, naming the key.
        """
        refusal = self.overlap_refusal()
        if refusal is not None:
            raise ValueError(f'train_cfg.max_staleness >= 1 needs a rollout backend that can '
                             f'generate while the trainer updates: {refusal}')

    def partial_refusal(self) -> str | None:
        """Why this backend cannot cut a running :meth:`generate` short at a weight push and
        hand back the tokens so far (``train_cfg.partial_rollout``), or None when it can
        (:meth:`preempt`). The default refuses: a backend says it can."""
        return (f'{type(self).__name__} cannot end a generation early with its tokens so far '
                '(RolloutBackend.partial_refusal)')

    def prepare_partial(self) -> None:
        """Called once (after :meth:`prepare_overlap`) when the loop will :meth:`preempt`
        generations (e.g. a server backend streams its answers from then on, so that a cut
        request still hands back its tokens).

        Raises:
            ValueError: the reason of :meth:`partial_refusal`, when it has one.
        """
        self.check_partial()

    def check_partial(self) -> None:
        """Refuses ``train_cfg.partial_rollout`` with this backend when it cannot
        :meth:`preempt` (the one wording of that refusal).

        Raises:
            ValueError: the reason of :meth:`partial_refusal`, naming the key.
        """
        refusal = self.partial_refusal()
        if refusal is not None:
            raise ValueError('train_cfg.partial_rollout needs a rollout backend that can end '
                             f'a generation early with its tokens so far: {refusal}')

    def preempt(self) -> None:
        """Ends every :meth:`generate` that began before this call, early and without
        error: each response comes back with the tokens (and logprobs) it has, and
        ``finish_reason='abort'`` unless it had already ended. A server backend returns once
        no request of those calls runs on the engine any more, so weights can be pushed; a
        backend whose calls run in the caller's process (the in-process one) may return at
        once, and the caller waits for its generating thread (the streaming stage does).
        Calls that begin afterwards are not affected. Called from the main thread while another thread
        generates (partial rollouts); only after :meth:`prepare_partial`."""
        raise NotImplementedError(self.partial_refusal())

    def request_slots(self) -> int | None:
        """How many requests this backend (this rank's copy) keeps in flight at once, over
        all its servers: its own cap, whatever the engines then run at once (more wait in
        the trainer for a slot); None when it sets no such cap (the in-process backend: a
        call is one batch). The streaming stage warns when its workers need more."""
        return None

    def abort(self) -> None:
        """Cancels a :meth:`generate` running on another thread, as far as the backend can
        (the step that wanted its batch failed, :meth:`RolloutAhead.discard
        <gepo_xtuner.engine.step.overlap.RolloutAhead.discard>`); that call then returns or
        raises soon, and a backend that cancels takes no further generation. Nothing by
        default: the call runs to its end."""

    def pop_metrics(self) -> dict[str, float]:
        """Figures since the last call (e.g. ``rollout/server/<i>/...``), then reset."""
        return {}

    def close(self) -> None:
        """Releases resources (servers, processes)."""

    def state_dict(self) -> dict[str, Any]:
        """State that changes during training and is checkpointed (none by default)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict`'s output (nothing by default)."""
