"""Test-only reward for the run-health tests: the opposite of ``ShortAnswerReward``."""

from gepo_xtuner.registry import REWARDS


@REWARDS.register_module()
class LongAnswerReward:
    """1.0 for completions longer than ``min_len`` characters: pays for length, not brevity."""

    def __init__(self, min_len: int = 3) -> None:
        self.min_len = min_len

    def __call__(self, completion: str, record: dict) -> float:
        return float(len(completion.strip()) > self.min_len)
