"""Test-only plugins imported by the training subprocesses through ``custom_imports``.

They are registered like any user plugin: a reward with signal even for an
untrained policy, a reward that fails on chosen records, a shaper with an entropy band
of its own (not GEPO's), and an observer hook that writes each rank's advantage state
after every step, one that writes the records each step trained on, and an in-process
rollout backend that records the thread and the
weights of each generation.
"""

import json
import os
import threading
import time

import torch
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from gepo_xtuner.advantage import AdvantageShaper
from gepo_xtuner.advantage.base import EntropyBand, Shaping
from gepo_xtuner.registry import ADVANTAGES, REWARDS, ROLLOUT_BACKENDS
from gepo_xtuner.rollout import HFRolloutBackend, LMDeployRolloutBackend, VLLMRolloutBackend

from .fingerprint import weights_fingerprint


@REWARDS.register_module()
class ShortAnswerReward:
    """1.0 for completions of at most ``max_len`` characters: random policies get mixed rewards."""

    def __init__(self, max_len: int = 3) -> None:
        self.max_len = max_len

    def __call__(self, completion: str, record: dict) -> float:
        return float(len(completion.strip()) <= self.max_len)


@REWARDS.register_module()
class DigitShareReward:
    """The share of the completion's characters that are digits: any two random responses
    of the tiny policy score differently, so every group carries signal at every step."""

    def __call__(self, completion: str, record: dict) -> float:
        return sum(c.isdigit() for c in completion) / max(len(completion), 1)


@REWARDS.register_module()
class FlakyReward(ShortAnswerReward):
    """Raises on records whose id is listed (a verifier bug), scores the rest."""

    def __init__(self, fail_ids: list[str], max_len: int = 3) -> None:
        super().__init__(max_len)
        self.fail_ids = set(fail_ids)

    def __call__(self, completion: str, record: dict) -> float:
        if record['id'] in self.fail_ids:
            raise RuntimeError(f'verifier crashed on {record["id"]}')
        return super().__call__(completion, record)


@ADVANTAGES.register_module()
class QuartileBandShaper(AdvantageShaper):
    """Leaves the advantages as they are and reports the group entropies' quartiles as its
    band: a shaper whose band has nothing of GEPO's (no state, no EMA, no ``gepo/`` name)."""

    def shape(self, advantages, groups, batch, state) -> Shaping:
        entropy = groups.entropy[groups.has_tokens]
        low, high = (float(q) for q in torch.quantile(entropy, torch.tensor(
            [0.25, 0.75], dtype=entropy.dtype)))
        shaping = Shaping.identity(advantages)
        shaping.band = EntropyBand(low, high, float(entropy.mean()),
                                   float(entropy.std(unbiased=False)), len(entropy))
        shaping.metrics = {'quartile/iqr': high - low}
        return shaping


@HOOKS.register_module()
class DumpAdvantageStateHook(Hook):
    """Appends ``{"step", "rank", "state"}`` per step to ``<work_dir>/state_rank<r>.jsonl``."""

    priority = 'LOWEST'

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        rank = dist.get_rank() if dist.is_initialized() else 0
        state = runner.train_loop.advantage_state
        row = dict(step=runner.iter + 1, rank=rank, world=int(os.environ.get('WORLD_SIZE', 1)),
                   state=state.state_dict() if state is not None else None,
                   num_prompts=len(data_batch))
        with open(os.path.join(runner.work_dir, f'state_rank{rank}.jsonl'), 'a') as fh:
            fh.write(json.dumps(row) + '\n')


@HOOKS.register_module()
class TrainedPromptsHook(Hook):
    """Appends ``{"step", "ids"}`` per step to ``<work_dir>/trained_rank<r>.jsonl``: the
    ``id`` of every record the step trained on, in order."""

    priority = 'LOWEST'

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        rank = dist.get_rank() if dist.is_initialized() else 0
        row = dict(step=runner.iter + 1, ids=[r['id'] for r in data_batch])
        with open(os.path.join(runner.work_dir, f'trained_rank{rank}.jsonl'), 'a') as fh:
            fh.write(json.dumps(row) + '\n')


@ROLLOUT_BACKENDS.register_module()
class RecordingRolloutBackend(HFRolloutBackend):
    """The in-process backend, writing one JSON line per :meth:`generate` call to
    ``$GEPO_TEST_GENERATE_LOG.<rank>``: the thread it ran on, the fingerprint of the
    weights it sampled with at the start and at the end of the call, and the prompts.
    A weight push during a generation would show as two different fingerprints."""

    def generate(self, requests, params):
        before = weights_fingerprint(self.model.state_dict())
        out = super().generate(requests, params)
        row = dict(thread=threading.current_thread().name, before=before,
                   after=weights_fingerprint(self.model.state_dict()),
                   prompts=len(requests), seeded=params.seed is not None, n=params.n,
                   ids=[list(map(int, r.input_ids)) for r in requests])
        rank = dist.get_rank() if dist.is_initialized() else 0
        with open(f'{os.environ["GEPO_TEST_GENERATE_LOG"]}.{rank}', 'a') as f:
            f.write(json.dumps(row) + '\n')
        return out


@ROLLOUT_BACKENDS.register_module()
class SlowRecordingRolloutBackend(RecordingRolloutBackend):
    """:class:`RecordingRolloutBackend` taking ``token_s`` seconds longer over each
    decoding step of its own calls (the trainer's forward passes, on another thread, are
    not slowed): generation outlasts the update, so every push finds a group in flight,
    which partial rollouts cut."""

    def __init__(self, token_s: float = 0.01, **kwargs) -> None:
        super().__init__(**kwargs)
        self.token_s = token_s
        self._slowed: set[int] = set()

    def attach(self, model, tokenizer) -> None:
        super().attach(model, tokenizer)
        slowed, token_s = self._slowed, self.token_s

        def slow(*args) -> None:  # a function, so the copy prepare_overlap makes keeps it
            if threading.get_ident() in slowed:
                time.sleep(token_s)

        self.model.register_forward_hook(slow)

    def generate(self, requests, params):
        self._slowed.add(threading.get_ident())
        try:
            return super().generate(requests, params)
        finally:
            self._slowed.discard(threading.get_ident())


#: the token ids whose logprobs identify the weights a vLLM server holds
VLLM_PROBE = [1, 11, 4, 30, 7, 22, 9, 15, 2, 40, 13]


@ROLLOUT_BACKENDS.register_module()
class RecordingVLLMRolloutBackend(VLLMRolloutBackend):
    """The vLLM backend, writing one JSON line per :meth:`generate` call to
    ``$GEPO_TEST_GENERATE_LOG.<rank>``: the thread, and the server's logprobs of
    :data:`VLLM_PROBE` at the start and at the end of the call (which weights it sampled
    with; a push during the call would show as two different lists). With
    ``$GEPO_TEST_SLOW_RANK=r``, rank ``r`` takes a second longer over each call (a slow
    rank: its generation still runs when the others are done)."""

    def generate(self, requests, params):
        rank = dist.get_rank() if dist.is_initialized() else 0
        before = self.probe_logprobs(VLLM_PROBE)
        out = super().generate(requests, params)
        if os.environ.get('GEPO_TEST_SLOW_RANK') == str(rank):
            time.sleep(1.0)
        row = dict(thread=threading.current_thread().name, before=before,
                   after=self.probe_logprobs(VLLM_PROBE), prompts=len(requests),
                   seeded=params.seed is not None)
        with open(f'{os.environ["GEPO_TEST_GENERATE_LOG"]}.{rank}', 'a') as f:
            f.write(json.dumps(row) + '\n')
        return out


@ROLLOUT_BACKENDS.register_module()
class BareImageIdsLMDeployBackend(LMDeployRolloutBackend):
    """A test double of the image payload LMDeploy was sent before: the chat template's bare
    image placeholder (``RolloutRequest.input_ids``) instead of the trainer's expanded
    prompt with collapsed runs. For InternVL, LMDeploy then expands it without the
    ``<img>`` / ``</img>`` the trainer's context has: the negative control of
    ``tests/test_rollout/test_lmdeploy_vl_server.py``."""

    def generate(self, requests, params):
        import dataclasses
        bare = [dataclasses.replace(r, model_input_ids=None) for r in requests]
        return super().generate(bare, params)
