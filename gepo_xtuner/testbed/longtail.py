"""A benchmark device: vLLM rollouts whose response lengths are imposed, long-tailed.

**Not for training.** :class:`LongTailVLLMBackend` makes a real ``vllm serve`` produce
responses whose lengths follow a log-normal distribution, so that
``benchmarks/bench_async.py --setup longtail`` can time the rollout schedules
(synchronous, one batch ahead, streaming, partial rollouts) on a workload with a long tail
while the model is a tiny random policy that would otherwise never stop by itself (or stop
after a few tokens, depending on its weights). The responses are meaningless text; only
their lengths, their token ids and their logprobs (the server's, as in any run) are real.

How a length is imposed: every prompt (its token ids, hashed) gets a deterministic target
length ``L = round(median * exp(sigma * z))``, ``z`` the standard normal quantile of the
hash, ``sigma = ln(tail) / 2.3263`` (so that ``p99 / p50 = tail``), clipped to
``[1, cap]`` with ``cap`` the sampling's ``max_new_tokens``; all ``K`` responses of the
prompt share it. The server is asked for ``max_tokens = L - tokens so far`` with
``ignore_eos=True`` and no stop tokens, and a response that reached its target is
reported ``finish_reason='stop'`` (``'length'`` when the target is the cap).

Partial rollouts continue a cut response with a request whose prompt is the original
prompt followed by the response so far
(:func:`~gepo_xtuner.engine.step.stream.continued`, which keeps the same ``extra`` dict).
The first call on a request therefore records the original prompt length and the target
in a private key of ``RolloutRequest.extra`` (:data:`PRIVATE_KEY`), which is never sent to
the server; a continuation reads it back to know how many tokens the response has and how
many are left. A continuation whose ``extra`` lacks that key (e.g. restored from a
checkpoint) would be taken for a new prompt: resuming is not supported by this device.
"""

import hashlib
import math
import statistics
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from ..registry import ROLLOUT_BACKENDS
from ..rollout.base import RolloutRequest, RolloutSample, SamplingParams
from ..rollout.vllm.backend import VLLMRolloutBackend

#: the ``RolloutRequest.extra`` key holding ``(original prompt length, target length)``
PRIVATE_KEY = '_longtail_plan'
#: the standard normal's 99th percentile (p99 / p50 of a log-normal is ``exp(sigma * Z99)``)
Z99 = 2.3263


def target_length(prompt_ids: Sequence[int], median: float, tail: float, cap: int,
                  salt: int = 0) -> int:
    """The imposed response length of a prompt: log-normal, a pure function of its tokens.

    Args:
        prompt_ids: the prompt's token ids.
        median: the distribution's median (tokens).
        tail: ``p99 / p50`` of the distribution (>= 1).
        cap: the largest length returned.
        salt: changes every draw (another workload with the same prompts).

    Returns:
        ``round(median * exp(sigma * z))`` clipped to ``[1, cap]``.
    """
    digest = hashlib.blake2b(repr((int(salt), [int(t) for t in prompt_ids])).encode(),
                             digest_size=8).digest()
    u = (int.from_bytes(digest, 'little') + 0.5) / 2**64  # in (0, 1)
    sigma = math.log(max(float(tail), 1.0)) / Z99
    z = statistics.NormalDist().inv_cdf(u)
    return int(min(max(round(median * math.exp(sigma * z)), 1), cap))


@ROLLOUT_BACKENDS.register_module()
class LongTailVLLMBackend(VLLMRolloutBackend):
    """:class:`~gepo_xtuner.rollout.vllm.backend.VLLMRolloutBackend` with imposed
    log-normal response lengths (a benchmark device; see the module docstring).

    Args:
        median: median target length (tokens).
        tail: ``p99 / p50`` of the target lengths.
        salt: seeds the length draw.
        **kwargs: :class:`~gepo_xtuner.rollout.vllm.backend.VLLMRolloutBackend`'s.
    """

    def __init__(self, median: float = 24.0, tail: float = 10.0, salt: int = 0,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        if median <= 0 or tail < 1:
            raise ValueError(f'LongTailVLLMBackend: median > 0 and tail >= 1, got {median}, '
                             f'{tail}')
        self.median, self.tail, self.salt = float(median), float(tail), int(salt)

    def _plan(self, request: RolloutRequest, params: SamplingParams) -> tuple[int, int]:
        """``(tokens generated so far, target)`` of ``request``; recorded in its ``extra``
        on the first call (the original prompt, capped by that call's
        ``max_new_tokens``)."""
        plan = request.extra.get(PRIVATE_KEY)
        if plan is None:
            prompt_len = len(request.input_ids)
            plan = (prompt_len, target_length(request.input_ids, self.median, self.tail,
                                              params.max_new_tokens, self.salt))
            request.extra[PRIVATE_KEY] = plan
        prompt_len, target = plan
        return len(request.input_ids) - prompt_len, target

    def generate(self, requests: Sequence[RolloutRequest], params: SamplingParams
                 ) -> list[list[RolloutSample]]:
        """``params.n`` responses per request, each exactly its prompt's target length
        (fewer tokens only when cut by :meth:`preempt`, ``finish_reason='abort'``).

        Requests are sent in one ``generate`` call of the parent per remaining budget,
        those calls running at once (so the server batches all of them).
        """
        budgets: dict[int, list[int]] = {}
        plans = []
        for i, r in enumerate(requests):
            done, target = self._plan(r, params)
            plans.append((done, target))
            budgets.setdefault(min(target - done, params.max_new_tokens), []).append(i)
        out: list[list[RolloutSample]] = [[] for _ in requests]
        jobs = []
        for budget, which in budgets.items():
            if budget <= 0:  # cut after its last token: nothing is left to generate
                for i in which:
                    out[i] = [RolloutSample([], [], 'stop') for _ in range(params.n)]
                continue
            sent = [replace(requests[i], extra={**{k: v for k, v in requests[i].extra.items()
                                                    if k != PRIVATE_KEY},
                                                 'ignore_eos': True}) for i in which]
            jobs.append((which, sent, replace(params, max_new_tokens=budget,
                                              stop_token_ids=())))
        call = super().generate
        if len(jobs) == 1:
            answers = [call(jobs[0][1], jobs[0][2])]
        elif jobs:
            with ThreadPoolExecutor(len(jobs)) as pool:
                answers = list(pool.map(lambda job: call(job[1], job[2]), jobs))
        else:
            answers = []
        for (which, _, _), groups in zip(jobs, answers):
            for i, group in zip(which, groups):
                done, target = plans[i]
                cap = done + params.max_new_tokens  # the response's cap, as first asked
                for sample in group:
                    if (sample.finish_reason == 'length' and target < cap
                            and done + len(sample.response_ids) >= target):
                        sample.finish_reason = 'stop'
                out[i] = group
        return out


__all__ = ['LongTailVLLMBackend', 'PRIVATE_KEY', 'target_length']
