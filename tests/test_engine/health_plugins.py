"""Test-only causes for the run-health tests: a reward that pays for length (the opposite of
``ShortAnswerReward``) and a rollout backend whose weights are never updated."""

import copy

from gepo_xtuner.registry import REWARDS, ROLLOUT_BACKENDS
from gepo_xtuner.rollout.hf import HFRolloutBackend


@REWARDS.register_module()
class LongAnswerReward:
    """1.0 for completions longer than ``min_len`` characters: pays for length, not brevity."""

    def __init__(self, min_len: int = 3) -> None:
        self.min_len = min_len

    def __call__(self, completion: str, record: dict) -> float:
        return float(len(completion.strip()) > self.min_len)


@ROLLOUT_BACKENDS.register_module()
class StaleWeightsRolloutBackend(HFRolloutBackend):
    """Generates with a frozen copy of the starting policy: weights never reach it.

    The classic inference-engine / trainer drift (a weight push that silently fails):
    rollout logprobs stay those of the first policy while the trainer's move on.
    """

    def attach(self, model, tokenizer) -> None:
        super().attach(copy.deepcopy(model), tokenizer)

    def update_weights(self, model) -> None:
        pass
