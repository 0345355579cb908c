"""Deterministic synthetic rollouts with the paper's domain regimes (for demos and tests).

Each domain has a mean per-token group entropy and accuracy; per prompt, the
accuracy is drawn from a Beta distribution around the domain's (prompts differ
in difficulty, which is what makes pooled skewness exceed the single-group
formula), the group's entropy level from a normal around the domain's, and each
sampled token's negative log-probability from an exponential with that mean.
The first three regimes are the paper's first-rollout observations for
Intern-S1-mini (physics 0.49 / 48 %, math 0.60 / 39 %, instruction following
0.78 / 16 %); general knowledge's entropy (0.81) is the paper's, its accuracy
an illustrative choice.
"""

from collections.abc import Iterator
from typing import Any

import numpy as np

PAPER_DOMAINS: dict[str, tuple[float, float]] = {
    'physics': (0.49, 0.48),
    'math': (0.60, 0.39),
    'instruction_following': (0.78, 0.16),
    'general_knowledge': (0.81, 0.55),
}


def synthetic_rollouts(num_steps: int = 5, prompts_per_domain: int = 16, k: int = 16,
                       max_len: int = 256, seed: int = 0,
                       domains: dict[str, tuple[float, float]] | None = None,
                       entropy_drift: float = -0.02) -> Iterator[dict[str, Any]]:
    """Yields rollout records ``{"step", "prompt_id", "domain", "reward", "logprobs"}``.

    Args:
        num_steps: rollout steps.
        prompts_per_domain: prompts per domain per step.
        k: responses per prompt.
        max_len: longest response; lengths are uniform in ``[max_len // 8, max_len]``.
        seed: RNG seed; the output is a pure function of the arguments.
        domains: name -> (mean group entropy, accuracy); default :data:`PAPER_DOMAINS`.
        entropy_drift: relative change of every domain's entropy per step.
    """
    rng = np.random.default_rng(seed)
    domains = PAPER_DOMAINS if domains is None else domains
    concentration = 3.0
    for step in range(num_steps):
        for name, (entropy, acc) in domains.items():
            level = entropy * (1 + entropy_drift)**step
            for j in range(prompts_per_domain):
                p = rng.beta(acc * concentration, (1 - acc) * concentration)
                h = max(0.05, rng.normal(level, 0.06))
                for _ in range(k):
                    length = int(rng.integers(max(1, max_len // 8), max_len + 1))
                    nll = rng.exponential(h, size=length)
                    yield dict(step=step, prompt_id=f'{name}-{step}-{j}', domain=name,
                               reward=float(rng.random() < p),
                               logprobs=np.round(-nll, 4).tolist())
