"""What every advantage processor consumes: N scored responses, grouped by prompt."""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class AdvantageInputs:
    """The advantage processors' input: a flat batch of N scored responses, grouped by prompt.

    (The trainer's tensors of the same responses are
    :class:`~gepo_xtuner.engine.step.batching.ResponseBatch`; the RL loop builds this from one.)

    Responses of one prompt share a group id; ids need not be contiguous or sorted.
    In data-parallel training each group must live entirely on one rank (shard by
    prompt, not by response): batch statistics then count every group once.

    Attributes:
        rewards: ``(N,)`` float, scalar reward per response. Must be finite.
        group_ids: ``(N,)`` integer, the prompt group of each response.
        logprobs: ``(N, T)`` float or None, log-probabilities of the sampled response
            tokens under the policy that generated them (rollout-engine logprobs or
            the trainer's old-policy logprobs), right- or left-padded.
        mask: ``(N, T)`` bool or 0/1 or None, True on real response tokens. Required
            with ``logprobs``.
        entropies: ``(N, T)`` float or None, optional full-vocabulary token
            entropies; processors that gate on batch entropy (AEPO) prefer them over
            the sampled-token estimate ``-logprobs``.
        domain_ids: ``(N,)`` integer in ``[0, len(domain_names))`` or None; used for
            per-domain metrics only, never for the math. Build it with
            :func:`encode_domains`.
        domain_names: names of the domain ids; required with ``domain_ids``.
        prompt_ids: optional prompt names, used only to name the culprit in errors.
    """

    rewards: Tensor
    group_ids: Tensor
    logprobs: Tensor | None = None
    mask: Tensor | None = None
    entropies: Tensor | None = None
    domain_ids: Tensor | None = None
    domain_names: Sequence[str] | None = None
    prompt_ids: Sequence[str] | None = None

    def __len__(self) -> int:
        """N, the responses of the batch (K, ``num_responses``, is per prompt)."""
        return self.rewards.shape[0]

    def validate(self) -> None:
        """Checks shapes and values; raises ``ValueError`` saying what to fix.

        Costs one reduction over the rewards (a sync point on GPU); the per-token
        tensors are checked for shape only.
        """
        n = self.rewards.shape[0] if self.rewards.dim() == 1 else -1
        if n < 0:
            raise ValueError(f'rewards must have shape (N,), got {tuple(self.rewards.shape)}')
        if n == 0:
            raise ValueError('the batch has no responses (rewards has shape (0,))')
        if not self.rewards.is_floating_point():
            raise ValueError(f'rewards must be a float tensor, got dtype {self.rewards.dtype}')
        if tuple(self.group_ids.shape) != (n, ):
            raise ValueError(f'group_ids must have shape ({n},) like rewards, '
                             f'got {tuple(self.group_ids.shape)}')
        if self.group_ids.is_floating_point() or self.group_ids.dtype == torch.bool:
            raise ValueError(f'group_ids must be an integer tensor, got dtype {self.group_ids.dtype}')
        if (self.logprobs is None) != (self.mask is None):
            raise ValueError('logprobs and mask must be given together (the mask marks real '
                             'response tokens in the padded logprobs)')
        if self.logprobs is not None:
            if self.logprobs.dim() != 2 or self.logprobs.shape[0] != n:
                raise ValueError(f'logprobs must have shape ({n}, T), got {tuple(self.logprobs.shape)}')
            if self.mask.shape != self.logprobs.shape:
                raise ValueError(f'mask must have the shape of logprobs {tuple(self.logprobs.shape)}, '
                                 f'got {tuple(self.mask.shape)}')
        if self.entropies is not None and (self.mask is None
                                           or self.entropies.shape != self.mask.shape):
            raise ValueError('entropies must come with logprobs/mask and have the same (N, T) shape')
        if (self.domain_ids is None) != (self.domain_names is None):
            raise ValueError('domain_ids and domain_names must be given together '
                             '(use gepo_xtuner.advantage.encode_domains)')
        if self.domain_ids is not None and tuple(self.domain_ids.shape) != (n, ):
            raise ValueError(f'domain_ids must have shape ({n},), got {tuple(self.domain_ids.shape)}')
        finite = torch.isfinite(self.rewards)
        if not bool(finite.all()):
            i = int((~finite).nonzero()[0, 0])
            who = (f'prompt {self.prompt_ids[i]!r}' if self.prompt_ids is not None else
                   f'group id {int(self.group_ids[i])}')
            raise ValueError(f'non-finite reward {float(self.rewards[i])} for response {i} of {who}: '
                             'fix the reward function; training on NaN/inf rewards is refused')


def encode_domains(domains: Sequence[str], device: torch.device | str | None = None
                   ) -> tuple[Tensor, list[str]]:
    """Maps per-response domain names to integer ids (first-seen order).

    Args:
        domains: N domain names.
        device: device of the returned ids.

    Returns:
        ``(domain_ids (N,) long, domain_names)``.

    Example:
        >>> ids, names = encode_domains(['math', 'code', 'math'])
        >>> ids.tolist(), names
        ([0, 1, 0], ['math', 'code'])
    """
    table: dict[str, int] = {}
    ids = [table.setdefault(d, len(table)) for d in domains]
    return torch.tensor(ids, dtype=torch.long, device=device), list(table)


#: The name before ``AdvantageInputs`` (it said "rollout" where it meant the processors'
#: input); kept so that existing plugins import.
RolloutBatch = AdvantageInputs

