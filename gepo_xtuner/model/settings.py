"""The policy's settings (``model=dict(type='RLPolicy', ...)``) as one typed, frozen object.

:class:`~gepo_xtuner.model.policy.RLPolicy` builds it first thing and
``tools/check_config.py`` builds the same object from the same ``model`` dict, so a value
the model refuses before loading any weights is refused by the check too, with the same
message. A new option is one field here, documented in the ``Attributes:`` entry.
"""

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..loss.base import PolicyLoss
from ..registry import POLICY_LOSSES
from ..settings import check_types, docstring_attributes, refuse_unknown
from .families import TEXT_MODEL_CLASS

__all__ = ['PolicySettings', 'PACKING_MODES']

PACKING_MODES = ('auto', 'on', 'off')
#: ``model`` keys that mmengine's ``BaseModel`` takes, not the policy
MODEL_KEYS = ('type', 'data_preprocessor', 'init_cfg')


@dataclass(frozen=True)
class PolicySettings:
    """What :class:`~gepo_xtuner.model.policy.RLPolicy` loads and how it trains, checked.

    Attributes:
        pretrained: Hugging Face model directory (or hub id where reachable); required.
        policy_loss: config of a :data:`~gepo_xtuner.registry.POLICY_LOSSES` entry, a
            :class:`~gepo_xtuner.loss.PolicyLoss`; required.
        tokenizer: tokenizer directory; defaults to the processor's tokenizer, else
            ``pretrained``.
        torch_dtype: parameter dtype, e.g. ``'float32'`` or ``'bfloat16'``.
        model_class: the ``from_pretrained`` class: a ``transformers`` name (default
            ``'AutoModelForCausalLM'``; e.g. ``'AutoModelForImageTextToText'``,
            ``'Qwen2VLForConditionalGeneration'``) or an importable
            ``'package.module.Class'``.
        trust_remote_code: allow the model's own code (models such as Intern-S1-mini
            ship their classes with the checkpoint); passed to model, tokenizer and
            processor loading.
        processor: directory of the model's ``AutoProcessor`` (tokenizer + image
            processor). Defaults to ``pretrained`` when ``model_class`` is not
            ``'AutoModelForCausalLM'``; text models load none.
        gradient_checkpointing: recompute activations in backward (less memory, about a
            third more compute).
        kl_coef: weight ``beta >= 0`` of a KL penalty to the initial weights (a frozen
            copy of ``pretrained``): the loss becomes ``L_policy + beta * KL_k3``
            (:func:`~gepo_xtuner.loss.kl.reference_kl_loss`, reduced like the policy
            loss), costing one extra no-grad forward per micro-batch. Default 0 (no
            reference model is loaded), as in GEPO's objective; GRPO's original
            objective uses one. Logged as ``loss/kl_ref``.
        packing: padding-free passes (:mod:`gepo_xtuner.model.packing`): each text-only
            micro-batch runs as ONE row of its real tokens, positions restarting per
            sequence and attention kept within each sequence, so no compute goes to
            padding; logprobs, entropies and gradients equal the padded path's.
            ``'auto'`` (default) packs when the model supports it (attention through
            ``transformers``' attention-function table, attention layers only, no sliding
            window) and a two-sequence probe at start-up confirms it; ``'on'`` raises
            where ``'auto'`` would not pack; ``'off'`` always runs the padded
            ``[left-padded prompt | right-padded response]`` block. Batches with images
            always take the padded path.
        pad_token: the token that fills padding, for tokenizers without one (Llama
            family). Default: the tokenizer's own pad token, else its EOS token (with a
            log line). Padding is always masked, so its identity only matters for a token
            the model must never see as a real one.
    """

    pretrained: str
    policy_loss: dict
    tokenizer: str | None = None
    torch_dtype: str = 'float32'
    model_class: str = TEXT_MODEL_CLASS
    trust_remote_code: bool = False
    processor: str | None = None
    gradient_checkpointing: bool = False
    kl_coef: float = 0.0
    packing: str = 'auto'
    pad_token: str | None = None

    def __post_init__(self) -> None:
        check_types('model', type(self), {f.name: getattr(self, f.name)
                                          for f in dataclasses.fields(self)})
        if self.packing not in PACKING_MODES:
            raise ValueError(f'model.packing must be one of {PACKING_MODES}, got '
                             f'{self.packing!r}')
        if not isinstance(getattr(torch, self.torch_dtype, None), torch.dtype):
            raise ValueError(f"model.torch_dtype {self.torch_dtype!r} is not a torch dtype; use "
                             "e.g. 'float32' or 'bfloat16'")
        if not self.kl_coef >= 0:
            raise ValueError(f'model.kl_coef must be a number >= 0, got {self.kl_coef!r}')

    @classmethod
    def keys(cls) -> list[str]:
        """The policy's keys of a ``model`` config."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def help(cls) -> dict[str, str]:
        """``key -> help text`` (this class's docstring)."""
        return docstring_attributes(cls)

    @classmethod
    def from_dict(cls, model: Mapping[str, Any]) -> 'PolicySettings':
        """Checks a ``model`` config (``type``, ``data_preprocessor`` and ``init_cfg``
        are the model base class's) and its policy loss, without loading anything.

        Raises:
            TypeError: an unknown key (with the closest one), a missing one, a value of
                the wrong type, or a loss that is not a ``PolicyLoss``.
            ValueError: a bad value, naming the key.
        """
        options = {k: v for k, v in model.items() if k not in MODEL_KEYS}
        refuse_unknown('model', options, cls.keys())
        missing = [k for k in ('pretrained', 'policy_loss') if k not in options]
        if missing:
            raise TypeError(f'model needs {" and ".join(missing)}')
        settings = cls(**options)
        settings.build_loss()  # its arguments checked before any weights load
        return settings

    @property
    def processor_dir(self) -> str | None:
        """The processor directory loaded: ``processor``, else ``pretrained`` for a
        non-text ``model_class``, else None."""
        if self.processor is None and self.model_class != TEXT_MODEL_CLASS:
            return self.pretrained
        return self.processor

    def build_loss(self) -> PolicyLoss:
        """The configured policy loss.

        Raises:
            TypeError: it is not a :class:`~gepo_xtuner.loss.PolicyLoss`.
            ValueError: its ``type`` is not registered.
        """
        try:
            loss = POLICY_LOSSES.build(self.policy_loss)
        except KeyError as exc:  # an unregistered name: mmengine's message says which
            raise ValueError(f'model.policy_loss: {exc.args[0]}') from None
        if not isinstance(loss, PolicyLoss):
            raise TypeError(f'model.policy_loss: {type(loss).__name__} must subclass '
                            'gepo_xtuner.loss.PolicyLoss (implement per_token; the base class '
                            'aggregates, reports metrics and holds the checkpointed state)')
        return loss
