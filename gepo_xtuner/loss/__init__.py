"""Policy-gradient losses; importing this package registers them in ``POLICY_LOSSES``.

Every loss subclasses :class:`~gepo_xtuner.loss.base.PolicyLoss` (the contract: a
per-token surrogate; the base class aggregates and reports)::

    loss, metrics = loss_fn(logprobs, old_logprobs, advantages, mask,
                            num_tokens=None, num_seqs=None, norm_length=None,
                            behaviour_weights=None)

with ``logprobs``, ``old_logprobs``, ``mask`` of shape ``(N, T)`` and ``advantages``
of shape ``(N,)`` or ``(N, T)``; ``metrics`` maps ``'area/name'`` to detached 0-dim
tensors. :mod:`gepo_xtuner.loss.behaviour` corrects for stale rollouts (behaviour policy
``mu`` behind the proximal policy whose logprobs are ``old_logprobs``).
"""

from gepo_xtuner.loss.aggregate import AGG_MODES, PolicyInputs, aggregate, masked_mean
from gepo_xtuner.loss.base import PolicyLoss, TokenLoss
from gepo_xtuner.loss.behaviour import (BEHAVIOUR_CORRECTIONS, BehaviourCorrection,
                                        behaviour_weights)
from gepo_xtuner.loss.cispo import CISPOLoss
from gepo_xtuner.loss.cov import ClipCovLoss, KLCovLoss
from gepo_xtuner.loss.kl import kl_k3, reference_kl_loss
from gepo_xtuner.loss.ppo import PPOClipLoss

__all__ = ['AGG_MODES', 'BEHAVIOUR_CORRECTIONS', 'BehaviourCorrection', 'CISPOLoss',
           'ClipCovLoss', 'KLCovLoss', 'PPOClipLoss', 'PolicyInputs', 'PolicyLoss', 'TokenLoss',
           'aggregate', 'behaviour_weights', 'kl_k3', 'masked_mean', 'reference_kl_loss']
