"""The policy as an mmengine model: a Hugging Face causal or vision-language LM plus a loss."""

import importlib
import inspect
import sys
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from mmengine.logging import print_log
from mmengine.model import BaseModel
from mmengine.registry import MODELS
from torch import Tensor
from transformers import AutoProcessor, AutoTokenizer, PreTrainedTokenizerBase

from ..loss.kl import reference_kl_loss
from ..ops.multimodal import MMInputs, mm_to
from ..ops.token import gather_logprobs, token_entropy
from ..settings import refuse_unknown
from .families import TEXT_MODEL_CLASS  # noqa: F401  (re-exported)
from .inputs import LossInputs
from .packing import (PackedRows, pack_rows, packed_sequences, restore_attention,
                      use_packed_attention)
from .settings import MODEL_KEYS, PACKING_MODES, PolicySettings  # noqa: F401  (re-exported)


@MODELS.register_module()
class RLPolicy(BaseModel):
    """Causal or vision-language LM whose ``forward(mode='loss')`` is a policy-gradient loss.

    Batches are ``[prompt | response]`` rows: prompts left-padded to a common
    width P, responses right-padded to width R. Only the R response positions
    are scored, so with ``num_logits_to_keep`` support the LM head runs on R + 1
    positions instead of P + R. For vision-language models the prompt holds the
    image placeholders already expanded (one token per image feature, as the
    processor writes them), so the responses are still the last R positions.

    ``inputs``: one micro-batch as :class:`~gepo_xtuner.model.inputs.LossInputs` (on the
    model's device), the typed contract of shapes and fields; a mapping of its field
    names is accepted too (:meth:`LossInputs.of`).

    Args:
        pretrained: Hugging Face model directory (or hub id where reachable).
        policy_loss: config of a :data:`~gepo_xtuner.registry.POLICY_LOSSES` entry.
        data_preprocessor, init_cfg: mmengine's ``BaseModel`` arguments.
        **options: the other keys of the ``model`` config, each one field of
            :class:`~gepo_xtuner.model.settings.PolicySettings` (tokenizer, dtype,
            model class, processor, KL, packing, ...), with its default and help there;
            checked before any weights load, by the same call ``tools/check_config.py``
            makes.

    Attributes:
        settings: the checked :class:`~gepo_xtuner.model.settings.PolicySettings`.
        packs: whether text-only micro-batches run packed.
        packing_problem: why packing was declined (None when it is on).
    """

    #: the object this class's options build (tools/check_config.py builds it too)
    settings_class = PolicySettings

    def __init__(self, pretrained: str, policy_loss: dict,
                 data_preprocessor: dict | None = None, init_cfg: dict | None = None,
                 **options: Any) -> None:
        settings = PolicySettings.from_dict(dict(options, pretrained=pretrained,
                                                 policy_loss=policy_loss))
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        self.settings = settings
        processor = settings.processor_dir
        for what, path in (('model', pretrained), ('tokenizer', settings.tokenizer),
                           ('processor', processor)):
            if path is not None:
                check_local_dir(what, path)
        loss_fn = settings.build_loss()
        remote = {'trust_remote_code': settings.trust_remote_code}
        dtype = getattr(torch, settings.torch_dtype)
        model_class = resolve_model_class(settings.model_class)
        self.llm = model_class.from_pretrained(pretrained, torch_dtype=dtype, **remote)
        self.processor = None if processor is None else load_processor(processor, remote)
        if settings.tokenizer is None and self.processor is not None:
            self.tokenizer = self.processor.tokenizer
        else:
            self.tokenizer = AutoTokenizer.from_pretrained(settings.tokenizer or pretrained,
                                                           **remote)
        set_pad_token(self.tokenizer, settings.pad_token)
        if settings.gradient_checkpointing:
            # non-reentrant: works whether or not the inputs (token ids) require grad
            self.llm.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={'use_reentrant': False})
        self.policy_loss = loss_fn
        self.kl_coef = float(settings.kl_coef)
        # The reference stays outside the module tree: not in checkpoints (it is
        # `pretrained` again on resume), not in the optimizer, not wrapped by DDP.
        self._reference: tuple[torch.nn.Module, ...] = ()
        if self.kl_coef > 0:
            ref = model_class.from_pretrained(pretrained, torch_dtype=dtype, **remote)
            self._reference = (ref.eval().requires_grad_(False), )
        params = inspect.signature(self.llm.forward).parameters
        self._keep_arg = next((k for k in ('logits_to_keep', 'num_logits_to_keep') if k in params),
                              None)
        self._rope_index = find_rope_index(self.llm)
        self.packs = False  # whether text-only micro-batches run packed
        self.packing_problem: str | None = 'model.packing is off'
        if settings.packing != 'off':
            self.packing_problem = self._enable_packing()
            if self.packing_problem is not None and settings.packing == 'on':
                raise ValueError(f"model.packing='on' but {self.packing_problem}; use "
                                 "packing='auto' (padded fallback) or 'off'")

    @classmethod
    def check_keys(cls, keys: Any) -> None:
        """Refuses ``model`` keys the policy does not take, with the closest one."""
        refuse_unknown('model', [k for k in keys if k not in MODEL_KEYS],
                       PolicySettings.keys())

    def _enable_packing(self) -> str | None:
        """Switches to packed passes if supported; returns why not (None: packing is on)."""
        problem = packing_support(self.llm)
        if problem is not None:
            return problem
        use_packed_attention(self.llm)
        try:
            problem = self._probe_packing()
        except Exception as exc:  # noqa: BLE001 - any failure means: stay padded
            problem = f'the packed probe failed ({type(exc).__name__}: {exc})'
        if problem is not None:
            restore_attention(self.llm)
            return problem
        self.packs = True
        for ref in self._reference:
            use_packed_attention(ref)
        return None

    @torch.no_grad()
    def _probe_packing(self) -> str | None:
        """Packed vs padded logprobs of two sequences of different lengths; None if equal.

        A model whose attention or token mixing ignores the packing lets the second
        sequence see the first, which moves its logprobs beyond float tolerance
        (``1e-3`` of their spread in float32, ``3e-2`` in 16-bit types).
        """
        weight = self.llm.get_input_embeddings().weight
        ids = (torch.arange(24, device=weight.device).view(2, 12) * 7919 + 11) % weight.shape[0]
        attention = torch.ones_like(ids)
        attention[1, :4] = 0  # row 1: 3 prompt tokens after 4 padding columns
        attention[0, -2:] = 0  # row 0: 3 response tokens, then 2 padding columns
        response = torch.ones(2, 5, dtype=torch.bool, device=weight.device)
        response[0, 3:] = False
        inputs = LossInputs(ids, attention, response)
        was_training = self.llm.training
        self.llm.eval()
        try:
            packed, _ = self.response_logprobs(inputs, packed=True)
            padded, _ = self.response_logprobs(inputs, packed=False)
        finally:
            self.llm.train(was_training)
        diff = float((packed - padded)[response].abs().max())
        spread = max(float(padded[response].std()), 1.0)
        tol = 1e-3 if weight.dtype in (torch.float32, torch.float64) else 3e-2
        if not diff <= tol * spread:
            return (f'packed and padded logprobs differ by {diff:.3g} on a probe (the model '
                    'does not keep packed sequences apart)')
        return None

    def position_ids(self, input_ids: Tensor, attention_mask: Tensor,
                     mm_inputs: MMInputs) -> Tensor:
        """Positions as generation assigns them: ``(B, L)``, or ``(3, B, L)`` for M-RoPE.

        Left padding: positions count real tokens only. Models with multimodal
        rotary positions (Qwen2-VL's ``get_rope_index``) get them from their own
        function, which also places image tokens on their 2-D grid; computing them
        here, rather than leaving it to the model, avoids the position offsets that
        model caches from its last ``generate`` call.
        """
        if self._rope_index is None:
            return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
        fn, names = self._rope_index
        return fn(input_ids=input_ids, attention_mask=attention_mask,
                  **{k: v for k, v in mm_inputs.items() if k in names})[0]

    def response_logits(self, input_ids: Tensor, attention_mask: Tensor, width: int,
                        mm_inputs: MMInputs | None = None,
                        model: torch.nn.Module | None = None) -> Tensor:
        """Logits that predict the last ``width`` tokens: ``(B, width, V)``.

        ``mm_inputs`` (images of the rows, see the class docstring) go to the model
        with the token ids, so the responses are scored on the image-conditioned
        context they were sampled from. ``model`` defaults to the policy (the KL
        penalty passes the reference).
        """
        model = self.llm if model is None else model
        mm = mm_to(mm_inputs, input_ids.device, model.dtype) if mm_inputs else {}
        position_ids = self.position_ids(input_ids, attention_mask, mm)
        kwargs = {self._keep_arg: width + 1} if self._keep_arg else {}
        logits = model(input_ids=input_ids, attention_mask=attention_mask,
                       position_ids=position_ids, use_cache=False, **mm, **kwargs).logits
        # Responses end every row, so the last positions are theirs whatever the prompt
        # (and its image tokens) expanded to.
        return logits[:, -(width + 1):-1]

    def uses_packing(self, inputs: LossInputs | dict[str, Any]) -> bool:
        """Whether a micro-batch runs packed: packing is on and it holds no images."""
        return self.packs and not LossInputs.of(inputs).mm_inputs

    def packed_logits(self, inputs: LossInputs | dict[str, Any],
                      model: torch.nn.Module | None = None
                      ) -> tuple[Tensor, Tensor, Tensor] | None:
        """Logits of the micro-batch as one packed row (:func:`~.packing.pack_rows`).

        Returns:
            ``(logits, labels, index)``: ``logits`` ``(1, T', V)`` of the packed
            positions from the first one that predicts a response token on,
            ``labels`` ``(1, T')`` the response tokens they predict (``-100``
            elsewhere), ``index`` ``(B, R)`` the position in ``T'`` that predicts
            response token ``t`` of row ``i``. None when the rows cannot be packed
            (a response without a prompt token).
        """
        model = self.llm if model is None else model
        inputs = LossInputs.of(inputs)
        ids, attention, mask = inputs.input_ids, inputs.attention_mask, inputs.response_mask
        positions = self.position_ids(ids, attention, {})
        rows: PackedRows | None = pack_rows(ids, attention, positions, mask)
        if rows is None:
            return None
        start = int(rows.index[mask].min()) if bool(mask.any()) else rows.input_ids.shape[1] - 1
        kwargs = {self._keep_arg: rows.input_ids.shape[1] - start} if self._keep_arg else {}
        logits = model(input_ids=rows.input_ids, position_ids=rows.position_ids,
                       attention_mask=packed_sequences(rows.cu_seqlens), use_cache=False,
                       **kwargs).logits
        logits = logits[:, -(rows.input_ids.shape[1] - start):]
        return logits, rows.labels[:, start:], (rows.index - start).clamp_min(0)

    def response_logprobs(self, inputs: LossInputs | dict[str, Any], with_entropy: bool = False,
                          packed: bool | None = None) -> tuple[Tensor, Tensor | None]:
        """Logprobs ``(B, R)`` of the response tokens, and optionally their entropy.

        Both refer to ``softmax(logits / inputs.temperature)`` (default 1). With
        packing (``packed``, default :meth:`uses_packing`), both are 0 at padding.
        """
        inputs = LossInputs.of(inputs)
        if packed is None:
            packed = self.uses_packing(inputs)
        scored = self.packed_logits(inputs) if packed else None
        if scored is not None:
            logits, labels, index = scored
            logits = tempered(logits, inputs.temperature)
            valid = inputs.response_mask
            logprobs = gather_logprobs(logits, labels)[0][index].masked_fill(~valid, 0.0)
            entropy = None
            if with_entropy:
                with torch.no_grad():
                    entropy = token_entropy(logits.detach())[0][index].masked_fill(~valid, 0.0)
            return logprobs, entropy
        width = inputs.response_mask.shape[1]
        logits = tempered(self.response_logits(inputs.input_ids, inputs.attention_mask,
                                               width, inputs.mm_inputs),
                          inputs.temperature)
        logprobs = gather_logprobs(logits, inputs.input_ids[:, -width:])
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = token_entropy(logits.detach())
        return logprobs, entropy

    def forward(self, inputs: LossInputs | dict[str, Any], data_samples: Any = None,
                mode: str = 'loss') -> dict[str, Tensor] | tuple[Tensor, Tensor | None]:
        """``mode='loss'``: policy loss and its metrics; ``mode='logprobs'``: logprobs, entropy.

        The loss is ``L_pg + kl_coef * L_kl`` over the tokens ``inputs.counted_mask``
        (``loss_mask``, else ``response_mask``), both reduced with the same ``agg`` and
        denominators. Behaviour correction for stale rollouts
        (:mod:`gepo_xtuner.loss.behaviour`): ``inputs.behaviour_weights`` (truncate modes)
        multiply the per-token policy-gradient term only; the reference-KL term is not
        reweighted, since it is a regulariser of ``pi_theta`` towards the reference, not
        an estimate under the sampling distribution that ``pi_prox / mu`` corrects.
        ``inputs.loss_mask`` (mask modes, veto) drops tokens from both terms and their
        denominators, so a dropped token takes no part in the objective.
        """
        inputs = LossInputs.of(inputs)
        if mode == 'logprobs':
            return self.response_logprobs(inputs, with_entropy=True)
        if mode != 'loss':
            raise ValueError(f"RLPolicy.forward supports mode='loss' or 'logprobs', got {mode!r}")
        logprobs, _ = self.response_logprobs(inputs)
        if inputs.old_logprobs is None or inputs.advantages is None:
            raise ValueError("RLPolicy.forward(mode='loss') needs inputs.old_logprobs and "
                             'inputs.advantages')
        mask = inputs.counted_mask
        loss, metrics = self.policy_loss(logprobs, inputs.old_logprobs, inputs.advantages,
                                         mask, num_tokens=inputs.num_tokens,
                                         num_seqs=inputs.num_seqs,
                                         norm_length=inputs.norm_length,
                                         behaviour_weights=inputs.behaviour_weights)
        if self.kl_coef > 0:
            kl = reference_kl_loss(logprobs, self.reference_logprobs(inputs),
                                   mask, self.policy_loss.agg,
                                   inputs.num_tokens, inputs.num_seqs, inputs.norm_length)
            loss = loss + self.kl_coef * kl
            metrics['loss/kl_ref'] = kl.detach()
        return {'loss': loss, **metrics}

    @torch.no_grad()
    def reference_logprobs(self, inputs: LossInputs | dict[str, Any]) -> Tensor:
        """Logprobs ``(B, R)`` of the response tokens under the frozen reference."""
        inputs = LossInputs.of(inputs)
        ref = self._reference[0]
        device = self.llm.get_input_embeddings().weight.device
        if ref.get_input_embeddings().weight.device != device:
            ref.to(device)
        scored = self.packed_logits(inputs, model=ref) if self.uses_packing(inputs) else None
        if scored is not None:
            logits, labels, index = scored
            lp = gather_logprobs(tempered(logits, inputs.temperature), labels)[0][index]
            return lp.masked_fill(~inputs.response_mask, 0.0)
        width = inputs.response_mask.shape[1]
        logits = self.response_logits(inputs.input_ids, inputs.attention_mask, width,
                                      inputs.mm_inputs, model=ref)
        return gather_logprobs(tempered(logits, inputs.temperature),
                               inputs.input_ids[:, -width:])

    def parse_losses(self, losses: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss is ``losses['loss']``; every other entry is a detached metric.

        (mmengine's default would sum every key containing "loss", which would add
        metrics such as ``loss/clipfrac`` to the objective.)
        """
        log_vars = OrderedDict((k, v.detach().float()) for k, v in losses.items())
        return losses['loss'], log_vars


def set_pad_token(tokenizer: Any, pad_token: str | None) -> None:
    """Gives ``tokenizer`` a pad token: ``pad_token`` if given, else its EOS if it has none.

    Raises:
        ValueError: the tokenizer has neither a pad nor an EOS token and none is given.
    """
    if pad_token is not None:
        if pad_token not in tokenizer.get_vocab():
            raise ValueError(f'model.pad_token {pad_token!r} is not in the tokenizer vocabulary; '
                             'name an existing token (e.g. the EOS token)')
        tokenizer.pad_token = pad_token
        return
    if tokenizer.pad_token_id is not None:
        return
    if tokenizer.eos_token is None:
        raise ValueError('the tokenizer has neither a pad token nor an EOS token: set '
                         "model.pad_token='<a token of its vocabulary>'")
    tokenizer.pad_token = tokenizer.eos_token
    print_log(f'the tokenizer has no pad token: padding with its EOS token '
              f'{tokenizer.eos_token!r} (padding is masked; set model.pad_token to choose '
              'another)', logger='current')


def packing_support(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot run packed passes, or None if its structure allows them.

    Packing needs attention layers that look their implementation up in
    ``transformers``' attention-function table (so :mod:`~.packing`'s can take over),
    full causal attention in every layer (no sliding window) and no other token
    mixing (linear-attention or convolution layers would carry state across the
    packed sequences).
    """
    config = model.config
    text = getattr(config, 'text_config', None) or config
    if getattr(text, 'use_sliding_window', False) or getattr(config, 'use_sliding_window', False):
        return 'the model uses sliding-window attention'
    kinds = set(getattr(text, 'layer_types', None) or ())
    if kinds - {'full_attention'}:
        return f'the model has {sorted(kinds - {"full_attention"})} layers, not only full attention'
    if not hasattr(config, '_attn_implementation'):
        return 'the model config names no attention implementation'
    layers = [type(m) for m in model.modules() if type(m).__name__.endswith('Attention')]
    if not layers or not all('ALL_ATTENTION_FUNCTIONS' in vars(sys.modules[c.__module__])
                             for c in layers):
        return (f'{type(model).__name__} does not use transformers\' attention-function table '
                f'(transformers {transformers.__version__})')
    return None


def tempered(logits: Tensor, temperature: Any) -> Tensor:
    """``logits / temperature`` (unchanged for None or 1): the sampled distribution's logits."""
    if temperature is None:
        return logits
    tau = float(temperature)
    if tau <= 0:
        raise ValueError(f'temperature must be > 0 to score samples, got {tau}')
    return logits if tau == 1.0 else logits / tau


def check_local_dir(what: str, path: str) -> None:
    """Raises if ``path`` names a local directory that is missing (hub ids pass)."""
    if not path:
        raise FileNotFoundError(f'{what} path is empty: set the config variable / environment '
                                'variable that points to it')
    local = path.startswith(('.', '/', '~')) or path.count('/') > 1  # hub ids are 'org/name'
    if local and not Path(path).expanduser().exists():
        message = (f'{what} directory {path!r} does not exist: set the config variable / '
                   'environment variable that points to it')
        if 'work_dirs/tiny' in Path(path).as_posix():
            message += ('. For the built-in CPU setting run `python tools/prepare_tiny_cpu.py` '
                        'first (make demo does)')
        raise FileNotFoundError(message)


def resolve_model_class(name: str) -> Any:
    """A ``transformers`` class by name, or any class by ``'package.module.Class'``."""
    try:
        if '.' in name:
            module, _, attr = name.rpartition('.')
            cls = getattr(importlib.import_module(module), attr)
        else:
            cls = getattr(transformers, name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(
            f'model_class {name!r} is neither a transformers class (e.g. '
            "'AutoModelForCausalLM', 'AutoModelForImageTextToText', "
            "'Qwen2VLForConditionalGeneration') nor an importable 'package.module.Class' "
            f'({exc})') from None
    if not hasattr(cls, 'from_pretrained'):
        raise ValueError(f'model_class {name!r} has no from_pretrained; name a model class')
    return cls


def load_processor(path: str, kwargs: dict[str, Any]) -> Any:
    """The ``AutoProcessor`` at ``path``; refuses a bare tokenizer (no image processor)."""
    fix = ("set model.processor to the directory with the model's preprocessor_config.json, "
           "or use model_class='AutoModelForCausalLM' for a text-only model")
    try:
        processor = AutoProcessor.from_pretrained(path, **kwargs)
    except OSError as exc:  # e.g. a tokenizer that names a processor class, without its files
        raise ValueError(f'{path} holds no multimodal processor ({exc}); {fix}') from None
    if isinstance(processor, PreTrainedTokenizerBase) or not hasattr(processor, 'tokenizer'):
        raise ValueError(f'{path} holds no multimodal processor (AutoProcessor found only '
                         f'{type(processor).__name__}); {fix}')
    return processor


def find_rope_index(model: torch.nn.Module) -> tuple[Callable[..., Any], set[str]] | None:
    """The model's multimodal rotary-position function and its argument names, if any.

    Qwen2-VL-style models expose ``get_rope_index`` on the model (or its inner
    ``model`` in newer transformers versions).
    """
    for owner in (model, getattr(model, 'model', None)):
        fn = getattr(owner, 'get_rope_index', None)
        if callable(fn):
            return fn, set(inspect.signature(fn).parameters)
    return None
