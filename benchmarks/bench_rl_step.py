"""Trainer side of one RL step (old-logprob pass + update) against the floor, padding and TRL.

One process, one workload, four variants timed in interleaved rounds (medians):

- ``floor``: the bare compute of the same two passes over exactly the real tokens,
  packed, no padding: a no-grad forward, then a forward + backward of the summed
  next-token cross-entropy over every real token, per block of the same real-token
  budget; no logprob/entropy bookkeeping, no policy loss, no optimizer step.
- ``ours``: the RL loop's own ``engine/step/update.py`` functions (``old_logprobs``, ``ppo_update``:
  ``micro_batches`` -> ``RLPolicy`` -> ``optimizer_step``, AdamW, clip 1) on an
  ``RLPolicy`` that packs (``packing='auto'``), budget ``--max-tokens`` real tokens.
- ``padded``: the same loop code on ``RLPolicy(packing='off')``: length-sorted
  micro-batches of at most ``--max-tokens`` padded positions, each a
  ``[left-padded prompt | right-padded response]`` block.
- ``trl``: TRL's ``GRPOTrainer`` (set up as in ``benchmarks/vs_trl.py``: CISPO,
  AdamW, clip 1, no KL) on the same responses: its old-logprob pass
  (``_get_per_token_logps_and_entropies``), then per micro-batch of
  ``per_device_train_batch_size`` rows what ``training_step`` does after generation
  (``compute_loss`` + ``accelerator.backward``), then one clipped optimizer step. As in TRL, all
  rows are padded to the batch's longest completion, shuffled and split into
  micro-batches of a fixed row count, here the most rows whose padded block fits the
  same ``--max-tokens`` budget.

Workload: a Qwen2 of ~24M parameters built from a config (random weights, fp32),
``--responses`` responses of log-normal length (``sigma`` 0.9: the 90th percentile
is about 10x the 10th, as for reasoning outputs), prompts of 6-14 tokens as in the
tiny setting, one minibatch (one optimizer step). Throughput is real tokens
(prompt + response) per second of the two passes. Memory: peak resident memory
above the level before the variant's run (sampled every 2 ms after returning freed
heap to the OS), so it covers activations, logits, gradients and, once created,
optimizer state.

``--model DIR`` runs the same comparison on a Hugging Face model directory instead (its
own vocabulary and weights; e.g. SmolLM2-135M-Instruct from ``tools/prepare_smollm2.py``:
``--model work_dirs/smollm2/model --prompt-lengths 30 80``, chat prompts of that length).
``--rollout-tokens T`` also times the rollout side: ``HFRolloutBackend`` sampling ``T``
new tokens for every prompt of the workload (temperature 1), printed as generated
tokens/s.

``--device cuda --dtype bfloat16`` runs every variant on the GPU in bf16 (TRL stays a
CPU-only column): the clock starts and stops on a synchronized device, memory is the
peak of the CUDA allocator above the level before the run, and each line adds the
model-FLOPs utilisation ``mfu = useful FLOPs / seconds / peak``. Useful FLOPs count
real tokens only (``gepo_xtuner.testbed.gpu.step_flops``): a forward over a sequence
of ``l`` tokens is ``2 N l + 2 n_layers d_attn l (l + 1)`` (``N`` parameters, causal
``QK^T`` and ``PV``), a backward two forwards, and the step one no-grad forward plus a
forward and backward: ``4 * sum_seq (2 N l + 2 n_layers d_attn l (l + 1))``, 8 N per
token plus attention. The peak is the GPU's bf16 dense peak looked up by name
(``PEAK_BF16_TFLOPS``: H100 SXM and H200 989 TFLOP/s) or ``--peak-tflops``.

Needs TRL for ``trl``: ``make bench-step`` puts ``work_dirs/trl_deps`` (``make
bench-trl``'s TRL 1.16 + transformers 4.57) first on ``PYTHONPATH``; without it the
TRL column is skipped and its ratio printed as ``nan``. Last line:
``ratio_ours_over_floor=<x> ratio_padded_over_ours=<y> ratio_trl_over_ours=<z>``.
"""

import argparse
import ctypes
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.modules.setdefault('bitsandbytes', None)  # see vs_trl.py: would break `import trl`

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gepo_xtuner.testbed.rl_step import QWEN2_0_5B, build_qwen2, workload  # noqa: E402


def rss() -> int:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def trim_heap() -> None:
    try:
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except OSError:
        pass


def measured(fn: Callable[[], Any], device: torch.device) -> tuple[float, float]:
    """``(seconds, peak extra MiB)`` of one call.

    CPU: wall time, and peak resident memory above the level before the call. CUDA: the
    device is synchronized before the clock starts and before it stops (the time covers
    every kernel the call queued), and the memory is the peak of ``torch.cuda``'s allocator
    above what was allocated before the call.
    """
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t
        return seconds, max(0, torch.cuda.max_memory_allocated(device) - base) / 2**20
    trim_heap()
    base, peak, stop = rss(), [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    t = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t
    stop.set()
    thread.join()
    return seconds, max(0, max(peak[0], rss()) - base) / 2**20


Step = Callable[[Any, torch.Tensor], None]  # (ResponseBatch, advantages (N,)) -> None


def make_loop_step(policy: Any, max_tokens: int) -> Step:
    from gepo_xtuner.testbed.rl_step import adamw, rl_step, step_settings

    def step(batch: Any, advantages: torch.Tensor) -> None:
        rl_step(policy, adamw(policy), batch, advantages, step_settings(max_tokens, len(batch)))

    return step


def make_floor_step(model: Any, max_tokens: int) -> Step:
    from gepo_xtuner.engine.step.batching import micro_batches
    from gepo_xtuner.model.packing import pack_rows, packed_sequences, use_packed_attention
    use_packed_attention(model)

    device = model.device

    def forward(packed: Any) -> torch.Tensor:
        return model(input_ids=packed.input_ids.to(device),
                     position_ids=packed.position_ids.to(device),
                     attention_mask=packed_sequences(packed.cu_seqlens.to(device)),
                     use_cache=False).logits

    def step(batch: Any, advantages: torch.Tensor) -> None:
        prompt_len, response_len = batch.lengths()
        blocks = []
        for rows in micro_batches(torch.arange(len(batch)), prompt_len, response_len,
                                  max_tokens, packed=True):
            part = batch.rows(rows)
            positions = (part.attention_mask.cumsum(-1) - 1).clamp_min(0)
            packed = pack_rows(part.input_ids, part.attention_mask, positions,
                               part.response_mask)
            targets = packed.input_ids.roll(-1, 1)
            targets[0, (packed.cu_seqlens[1:] - 1).long()] = -100  # a sequence's last token
            blocks.append((packed, targets))
        with torch.no_grad():
            for packed, _ in blocks:
                forward(packed)
        for packed, targets in blocks:
            logits = forward(packed)
            F.cross_entropy(logits[0], targets[0].to(device), reduction='sum').backward()
        model.zero_grad(set_to_none=True)

    return step


def make_trl_step(model_dir: Path, rows: int, work: Path) -> Step:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    args = GRPOConfig(
        output_dir=str(work / 'trl'), use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, optim='adamw_torch', per_device_train_batch_size=rows,
        # generation is bypassed: these only satisfy GRPOConfig's divisibility checks
        steps_per_generation=1 if rows > 1 else 2, num_generations=max(rows, 2),
        learning_rate=1e-6, adam_beta1=0.9,
        adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0, lr_scheduler_type='constant',
        beta=0.0, loss_type='cispo', epsilon_high=5.0, max_completion_length=4096,
        logging_steps=10**9, save_strategy='no', report_to='none', disable_tqdm=True,
        use_vllm=False)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
        train_dataset=Dataset.from_list([dict(prompt='x')] * 2),
        processing_class=AutoTokenizer.from_pretrained(model_dir))
    trainer.create_optimizer_and_scheduler(num_training_steps=10**6)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's train loop
    model = trainer.model
    model.train()

    def step(batch: Any, advantages: torch.Tensor) -> None:
        p = batch.input_ids.shape[1] - batch.response_width
        prompt_ids, prompt_mask = batch.input_ids[:, :p], batch.attention_mask[:, :p]
        completion_ids, completion_mask = batch.input_ids[:, p:], batch.attention_mask[:, p:]
        tokens = completion_mask.sum().float()  # TRL: a tensor
        with torch.no_grad():  # TRL's old-logprob pass, in chunks of per_device rows
            old, _, _ = trainer._get_per_token_logps_and_entropies(
                model, batch.input_ids, batch.attention_mask, completion_ids.shape[1],
                batch_size=rows)
        for chunk in torch.randperm(len(batch)).split(rows):
            inputs = dict(prompt_ids=prompt_ids[chunk], prompt_mask=prompt_mask[chunk],
                          completion_ids=completion_ids[chunk],
                          completion_mask=completion_mask[chunk],
                          advantages=advantages[chunk], old_per_token_logps=old[chunk],
                          num_items_in_batch=tokens)
            # Trainer.training_step minus its _prepare_inputs (which would generate)
            with trainer.compute_loss_context_manager():
                loss = trainer.compute_loss(model, inputs, num_items_in_batch=tokens)
            trainer.accelerator.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)

    return step


def time_rollout(policy: Any, batch: Any, new_tokens: int) -> tuple[int, float]:
    """``(generated tokens, seconds)`` of sampling ``new_tokens`` for each workload prompt."""
    from gepo_xtuner.rollout import HFRolloutBackend, RolloutRequest, SamplingParams
    backend = HFRolloutBackend(max_sequences_per_call=64)
    backend.attach(policy.llm, policy.tokenizer)
    width = batch.input_ids.shape[1] - batch.response_width
    requests = [RolloutRequest(input_ids=row[:width][mask[:width].bool()].tolist())
                for row, mask in zip(batch.input_ids, batch.attention_mask)]
    # no stop token: every prompt gets new_tokens tokens, a fixed amount of work
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=new_tokens, stop_token_ids=())
    device = next(policy.parameters()).device
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    samples = backend.generate(requests, params)
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    return sum(len(s[0].response_ids) for s in samples), seconds


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--responses', type=int, default=32)
    p.add_argument('--median-length', type=float, default=48.0)
    p.add_argument('--sigma', type=float, default=0.9, help='log-normal shape of the lengths')
    p.add_argument('--max-length', type=int, default=512)
    p.add_argument('--max-tokens', type=int, default=4096, help='tokens per micro-batch')
    p.add_argument('--vocab', type=int, default=8192)
    p.add_argument('--hidden', type=int, default=512)
    p.add_argument('--layers', type=int, default=6)
    p.add_argument('--qwen2-0.5b', dest='qwen2_05b', action='store_true',
                   help="build Qwen2.5-0.5B's shapes (494M parameters, its vocabulary; "
                   '--vocab/--hidden/--layers then do not apply)')
    p.add_argument('--rounds', type=int, default=3, help='interleaved timed rounds')
    p.add_argument('--threads', type=int, default=torch.get_num_threads())
    p.add_argument('--skip-trl', action='store_true')
    p.add_argument('--model', help='a Hugging Face model directory to run instead of the '
                   'built Qwen2 (--vocab/--hidden/--layers then do not apply)')
    p.add_argument('--prompt-lengths', type=int, nargs=2, default=(6, 14), metavar=('LO', 'HI'),
                   help='prompt lengths in tokens, drawn uniformly')
    p.add_argument('--rollout-tokens', type=int, default=0,
                   help='also time sampling this many new tokens per prompt (0: skip)')
    p.add_argument('--device', default='cpu', help="'cpu' or 'cuda' (or 'cuda:N')")
    p.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16', 'float16'),
                   help='parameter dtype of every variant')
    p.add_argument('--peak-tflops', type=float, default=None,
                   help='the device peak for MFU (default: bf16 dense peak looked up by the '
                   'GPU name; none on CPU)')
    p.add_argument('--work-dir', default=str(ROOT / 'work_dirs' / 'bench_rl_step'),
                   help='where the model is written')
    a = p.parse_args(argv)
    t_start = time.perf_counter()
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    dtype = getattr(torch, a.dtype)
    (work := Path(a.work_dir).resolve()).mkdir(parents=True, exist_ok=True)
    if a.model:
        from transformers import AutoConfig
        model_dir = Path(a.model).resolve()
        config = AutoConfig.from_pretrained(model_dir)
        a.vocab, a.hidden, a.layers = (config.vocab_size, config.hidden_size,
                                       config.num_hidden_layers)
        params = 0  # counted once loaded
        name = f'{config.model_type} from {model_dir}'
    else:
        model_dir = work / 'model'
        shape = {}
        if a.qwen2_05b:
            a.vocab, a.hidden, a.layers = (QWEN2_0_5B['vocab_size'], QWEN2_0_5B['hidden_size'],
                                           QWEN2_0_5B['num_hidden_layers'])
            shape = dict(heads=QWEN2_0_5B['num_attention_heads'],
                         kv_heads=QWEN2_0_5B['num_key_value_heads'],
                         intermediate=QWEN2_0_5B['intermediate_size'])
        params = build_qwen2(model_dir, a.vocab, a.hidden, a.layers, **shape)
        name = 'Qwen2 built from a config' + (" (Qwen2.5-0.5B's shapes)" if shape else '')
    from gepo_xtuner.testbed.gpu import device_summary, peak_bf16_tflops, step_flops
    batch, advantages = workload(a.responses, a.median_length, a.sigma, a.max_length, a.vocab,
                                 seed=0, prompt_lengths=tuple(a.prompt_lengths))
    prompt_len, response_len = batch.lengths()
    real = int(prompt_len.sum() + response_len.sum())
    q = torch.quantile(response_len.float(), torch.tensor([0.1, 0.5, 0.9]))
    info = device_summary(device) if device.type == 'cuda' else {}
    print(f'versions: torch={torch.__version__} '
          f'transformers={__import__("transformers").__version__} threads={a.threads}'
          + (f' device={info["device"]} cuda={info["cuda"]}' if info else ''))
    from transformers import AutoModelForCausalLM
    from gepo_xtuner.model.policy import RLPolicy
    loss = dict(type='CISPOLoss', eps_low=1.0, eps_high=4.0)
    ours = RLPolicy(str(model_dir), loss, torch_dtype=a.dtype).to(device)
    params = params or sum(p.numel() for p in ours.llm.parameters())
    print(f'workload: {name}, {params / 1e6:.1f}M params (hidden {a.hidden}, {a.layers} layers, '
          f'vocab {a.vocab}), {a.dtype} {device}; {a.responses} responses, lengths p10/p50/p90 = '
          f'{q[0]:.0f}/{q[1]:.0f}/{q[2]:.0f} (max {int(response_len.max())}), prompts '
          f'{int(prompt_len.min())}-{int(prompt_len.max())}; {real} real tokens, padded block '
          f'{batch.input_ids.numel()}; budget {a.max_tokens} tokens per micro-batch')

    padded = RLPolicy(str(model_dir), loss, torch_dtype=a.dtype, packing='off').to(device)
    assert ours.packs, ours.packing_problem
    steps: dict[str, Step] = {
        'floor': make_floor_step(AutoModelForCausalLM.from_pretrained(
            model_dir, torch_dtype=dtype).to(device), a.max_tokens),
        'ours': make_loop_step(ours, a.max_tokens),
        'padded': make_loop_step(padded, a.max_tokens)}
    trl_note = ''
    if not a.skip_trl and device.type != 'cpu':
        trl_note = ' (TRL: CPU only here; its GRPOTrainer is set up with use_cpu=True)'
    elif not a.skip_trl:
        rows = max(1, a.max_tokens // batch.input_ids.shape[1])  # TRL pads to the longest
        try:
            steps['trl'] = make_trl_step(model_dir, rows, work)
            trl_note = f' trl={__import__("trl").__version__} ({rows} rows per micro-batch)'
        except ImportError as exc:
            trl_note = f' (TRL not importable: {exc}; run `make bench-step`)'
    print(f'variants: {", ".join(steps)}{trl_note}')
    small = torch.arange(4)
    for fn in steps.values():  # warm-up on 4 rows: optimizer state, first-call costs
        fn(batch.rows(small), advantages[small])
    times: dict[str, list[float]] = {k: [] for k in steps}
    mems: dict[str, list[float]] = {k: [] for k in steps}
    names = list(steps)
    for r in range(a.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            seconds, mib = measured(lambda: steps[name](batch, advantages), device)
            times[name].append(seconds)
            mems[name].append(mib)
    med = {k: statistics.median(v) for k, v in times.items()}
    config = ours.llm.config
    heads = config.num_attention_heads
    flops = step_flops(params, config.num_hidden_layers,
                       heads * (getattr(config, 'head_dim', None) or config.hidden_size // heads),
                       (prompt_len + response_len).tolist())
    peak = a.peak_tflops or (peak_bf16_tflops(info['device']) if info else None)
    print(f'useful FLOPs of the step: {flops:.4g} (8 N per real token + causal attention; '
          f'benchmarks/bench_rl_step.py docstring); peak '
          f'{f"{peak:g} TFLOP/s" if peak else "unknown (no MFU)"}')
    for name in names:
        mfu = f'  mfu={flops / med[name] / (peak * 1e12):.4f}' if peak else ''
        print(f'{name:<7} median_s={med[name]:.3f} (min {min(times[name]):.3f}, max '
              f'{max(times[name]):.3f})  tokens_per_s={real / med[name]:.0f}  '
              f'peak_extra_mib={max(mems[name]):.0f}{mfu}')
    if a.rollout_tokens > 0:
        tokens, seconds = time_rollout(ours, batch, a.rollout_tokens)
        print(f'rollout  HFRolloutBackend {len(batch)} prompts x {a.rollout_tokens} new tokens: '
              f'{seconds:.2f}s  generated_tokens_per_s={tokens / seconds:.1f}')
    print(f'total wall time {time.perf_counter() - t_start:.1f}s; load average '
          f'{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores')
    trl = med['trl'] / med['ours'] if 'trl' in med else float('nan')
    print(f'ratio_ours_over_floor={med["ours"] / med["floor"]:.3f} '
          f'ratio_padded_over_ours={med["padded"] / med["ours"]:.3f} ratio_trl_over_ours={trl:.3f}')


if __name__ == '__main__':
    main()
