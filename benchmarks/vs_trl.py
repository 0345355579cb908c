"""Step time of this package's RL loop vs TRL's ``GRPOTrainer``: same CPU workload, one process.

``make bench-trl`` runs it with ``requirements-trl.txt`` installed apart, first on
``PYTHONPATH``. Workload, read from ``configs/gepo_tiny_cpu.py`` so both match by construction:
the same tiny model weights (one copy per side), fp32 CPU, the config's B prompts x K
responses and ``max_new_tokens`` (the workload line printed first says which), temperature 1,
no top-p/k; AdamW steps of the config's minibatch per generation batch (equal lr/betas, no
decay, constant lr, clip 1); no reference model/KL; exact-match reward; CISPO, IS weight
capped at 5 (TRL ``loss_type='cispo', epsilon_high=5`` = ours ``eps_high=4``), token-level
normalisation; one pre-shuffled ``train.jsonl`` order: step i, the same B prompts.

Method: each unmodified loop runs in its own thread, never both at once: a baton (``Gate``)
gives one side ``--steps`` steps while the other waits; after ``--warmup`` steps each, blocks
alternate for ``--rounds`` rounds (who starts alternates too). A step (a generation batch + its
4 optimizer steps) is timed by one clock between consecutive step ends of a side (ours:
``after_train_iter`` of a lowest-priority hook; TRL: ``on_step_end`` of every 4th optimizer
step; a block's first step counts from the hand-over), so it includes all framework work
(data, rollout, reward, old logprobs, updates, hooks). Tokens/s = completion tokens (with EOS)
/ rollout time: ours ``time/rollout`` (tokenise, ``generate`` with logits, logprobs); TRL has no
rollout timer without a tracker, so its ``_generate_single_turn`` (pad, ``generate``, cut at
EOS) is timed by wrapping that method on the trainer instance.

Fairness: no validation/eval, checkpoints, plots or per-step logging on either side; TRL
defaults that add work ours does not do are off (gradient checkpointing, bf16, fused AdamW); old
logprobs in chunks of 32 rows on both (our config: 64); same thread count. Different by design:
ours does GEPO advantages and full-vocab entropy in the old-logprob pass, TRL group-std
advantages and entropy in the loss pass; sampled lengths differ (own RNG, weights drift). Last
line: ``ratio_trl_over_ours_step_time=<median TRL step / median ours step>`` (>= 1: ours faster).
"""
import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
# unused by both; bitsandbytes 0.45 + triton >= 3.2 fails on import and would break `import trl`
sys.modules.setdefault('bitsandbytes', None)

import torch  # noqa: E402


class Gate:
    """Baton between the coordinator and one training thread; records that side's steps."""

    def __init__(self, name: str, threads: int) -> None:
        self.name, self.threads, self.left, self.record, self.t0 = name, threads, 0, False, 0.0
        self.go, self.done = threading.Semaphore(0), threading.Semaphore(0)
        self.steps: list[tuple[float, dict[str, float]]] = []  # (seconds, rollout stats)
        self.error: BaseException | None = None

    def pause(self) -> None:  # training thread: hand the baton back, wait for the next block
        self.done.release()
        self.go.acquire()
        torch.set_num_threads(self.threads)
        self.t0 = time.perf_counter()

    def step_done(self, extra: dict[str, float]) -> None:  # training thread: a step ended
        now = time.perf_counter()
        if self.record:
            self.steps.append((now - self.t0, extra))
        self.t0, self.left = now, self.left - 1
        if self.left == 0:
            self.pause()

    def run(self, steps: int = 0, record: bool = False, fn: Callable | None = None) -> None:
        """Coordinator: start ``fn`` up to its 1st step, or run ``steps`` more (0: let it end)."""
        if fn is None:
            self.left, self.record = steps, record
            self.go.release()
        else:
            threading.Thread(target=self._target, args=(fn, ), daemon=True).start()
        self.done.acquire()
        if self.error is not None:
            raise RuntimeError(f'{self.name} failed') from self.error

    def _target(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except BaseException as exc:  # re-raised by the coordinator
            self.error = exc
        finally:
            self.done.release()


def tiny_dir(arg: str | None, work: Path) -> Path:  # an untrained one if none was prepared
    path = Path(arg or os.environ.get('GEPO_TINY_DIR', 'work_dirs/tiny_cpu')).resolve()
    if not (path / 'model' / 'config.json').is_file():
        from gepo_xtuner.testbed.synthetic_tasks import build_task_files
        from gepo_xtuner.testbed.tiny import build_char_tokenizer, build_tiny_model
        path, tok = work / 'tiny_untrained', build_char_tokenizer()
        print(f'note: no model from tools/prepare_tiny_cpu.py; UNTRAINED weights in {path}')
        build_tiny_model(len(tok), seed=0).save_pretrained(path / 'model')
        tok.save_pretrained(path / 'model')
        build_task_files(path / 'data', 200, 20, 0)
    return path


def build_ours(tiny: Path, train_file: Path, steps: int, work: Path, gate: Gate) -> Any:
    from mmengine.config import Config
    from mmengine.hooks import Hook
    from mmengine.registry import RUNNERS
    os.environ['GEPO_TINY_DIR'] = str(tiny)
    cfg = Config.fromfile(str(ROOT / 'configs' / 'gepo_tiny_cpu.py'))
    cfg.work_dir, cfg.log_level = str(work / 'ours'), 'WARNING'
    cfg.train_cfg.update(max_steps=steps, val=None)
    cfg.model.kl_coef = 0.0  # the workload has no reference model on either side (TRL beta=0)
    cfg.train_dataloader.dataset.path = str(train_file)
    cfg.train_dataloader.sampler.shuffle = False
    cfg.default_hooks.checkpoint.update(interval=10**9, save_last=False)
    cfg.default_hooks.logger.interval = 10**9
    cfg.custom_hooks = [h for h in cfg.custom_hooks if h['type'] != 'TrainingCurvesHook']
    runner = RUNNERS.build(cfg)

    class GateHook(Hook):
        def before_train_epoch(self, runner) -> None:
            gate.pause()

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
            row = runner.train_loop.history[-1]
            gate.step_done({'rollout': row['time/rollout'], 'tokens': row['perf/gen_tokens'],
                            'internal_step': row['time/step']})

    runner.register_hook(GateHook(), priority='LOWEST')
    return runner


def build_trl(cfg: Any, tiny: Path, records: list[dict], steps: int, work: Path,
              gate: Gate) -> Any:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from gepo_xtuner.reward import ExactMatchReward
    tc, opt, reward = cfg.train_cfg, cfg.optim_wrapper.optimizer, ExactMatchReward()
    per_rank = tc.minibatch_responses_per_rank
    per_gen = cfg.train_dataloader.batch_size * tc.num_responses // per_rank
    args = GRPOConfig(
        output_dir=str(work / 'trl'), use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, optim='adamw_torch', seed=cfg.randomness.seed,
        per_device_train_batch_size=per_rank, gradient_accumulation_steps=1,
        steps_per_generation=per_gen, num_iterations=tc.ppo_epochs,
        num_generations=tc.num_responses, max_completion_length=tc.sampling.max_new_tokens,
        temperature=tc.sampling.temperature, top_p=tc.sampling.top_p, top_k=tc.sampling.top_k,
        learning_rate=opt.lr, adam_beta1=opt.betas[0], adam_beta2=opt.betas[1],
        weight_decay=opt.weight_decay, max_grad_norm=cfg.optim_wrapper.clip_grad.max_norm,
        lr_scheduler_type='constant', warmup_steps=0, beta=0.0, loss_type='cispo',
        epsilon_high=1.0 + cfg.model.policy_loss.eps_high, max_steps=steps * per_gen,
        shuffle_dataset=False, logging_steps=10**9, save_strategy='no', eval_strategy='no',
        report_to='none', disable_tqdm=True, use_vllm=False)
    rows = [dict(prompt=tc.prompt_template.format(**r), answer=r['answer']) for r in records]
    gen: list[dict[str, float]] = []

    def exact_match(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [reward(c, {'answer': a}) for c, a in zip(completions, answer)]

    class GateCallback(TrainerCallback):
        def on_train_begin(self, *a: Any, **k: Any) -> None:
            gate.pause()

        def on_step_end(self, args: Any, state: Any, *a: Any, **k: Any) -> None:
            if state.global_step % per_gen == 0:
                gate.step_done(gen.pop())

    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny / 'model', dtype=torch.float32),
        reward_funcs=exact_match, args=args, train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(tiny / 'model'),
        callbacks=[GateCallback()])
    trainer.remove_callback(PrinterCallback)  # its only output is the end-of-run summary
    inner = trainer._generate_single_turn

    def timed_generate(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        ids, logprobs = inner(*a, **k)
        gen[:] = [{'rollout': time.perf_counter() - t, 'tokens': sum(map(len, ids))}]
        return ids, logprobs

    trainer._generate_single_turn = timed_generate
    return trainer


def report(gate: Gate) -> float:  # prints the side's summary, returns its median step time
    times, n = [t for t, _ in gate.steps], len(gate.steps)
    roll, toks = (sum(e[k] for _, e in gate.steps) for k in ('rollout', 'tokens'))
    med = statistics.median(times)
    print(f'{gate.name:<5} steps={n:<3} median_step_s={med:.4f} (min {min(times):.4f}, '
          f'max {max(times):.4f})  gen_tokens/step={toks / n:.1f}  rollout_s/step='
          f'{roll / n:.4f}  gen_tok_per_s(completion tokens / rollout time)={toks / roll:.1f}')
    return med


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--tiny-dir', help='default: $GEPO_TINY_DIR or work_dirs/tiny_cpu')
    p.add_argument('--work-dir', default=str(ROOT / 'work_dirs' / 'bench_trl'))
    p.add_argument('--steps', type=int, default=4, help='steps per block')
    p.add_argument('--rounds', type=int, default=5, help='blocks per side')
    p.add_argument('--warmup', type=int, default=1, help='unmeasured steps per side first')
    p.add_argument('--threads', type=int, default=torch.get_num_threads())
    p.add_argument('--skip-trl', action='store_true', help='only our loop (no TRL needed)')
    a = p.parse_args(argv)
    t_start = time.perf_counter()
    torch.set_num_threads(a.threads)
    (work := Path(a.work_dir).resolve()).mkdir(parents=True, exist_ok=True)
    tiny = tiny_dir(a.tiny_dir, work)
    trl_version = '' if a.skip_trl else f' trl={__import__("trl").__version__}'
    print(f'versions: python={sys.version.split()[0]} torch={torch.__version__} '
          f'transformers={__import__("transformers").__version__}{trl_version}')
    records = [json.loads(x) for x in (tiny / 'data' / 'train.jsonl').read_text().splitlines()
               if x.strip()]
    random.Random(0).shuffle(records)
    (train_file := work / 'train_shuffled.jsonl').write_text(
        ''.join(json.dumps(r) + '\n' for r in records))
    total = a.warmup + a.steps * a.rounds
    gates = {'ours': Gate('ours', a.threads)}
    runner = build_ours(tiny, train_file, total, work, gates['ours'])
    cfg, tc = runner.cfg, runner.cfg.train_cfg
    fns = {'ours': runner.train}
    if not a.skip_trl:
        gates['trl'] = Gate('trl', a.threads)
        fns['trl'] = build_trl(cfg, tiny, records, total, work, gates['trl']).train
    print(f'workload: model={tiny / "model"} B={cfg.train_dataloader.batch_size} '
          f'K={tc.num_responses} max_new_tokens={tc.sampling.max_new_tokens} temperature='
          f'{tc.sampling.temperature} minibatch={tc.minibatch_responses_per_rank} '
          f'lr={cfg.optim_wrapper.optimizer.lr} threads={a.threads} fp32 cpu; schedule: '
          f'{a.warmup} warm-up + {a.rounds} alternating blocks of {a.steps} steps per side')
    for name, gate in gates.items():
        gate.run(fn=fns[name])
        if a.warmup:
            gate.run(a.warmup, record=False)
    for r in range(a.rounds):
        for gate in list(gates.values())[::(-1 if r % 2 else 1)]:
            gate.run(a.steps, record=True)
    for gate in gates.values():
        gate.run(0)  # the loop finishes (hooks/callbacks at train end), untimed
    medians = {name: report(gate) for name, gate in gates.items()}
    internal = statistics.median(e['internal_step'] for _, e in gates['ours'].steps)
    print(f'ours internal time/step (run_iter only: no hooks/data loading) median={internal:.4f}s')
    print(f'total wall time {time.perf_counter() - t_start:.1f}s; load average at end '
          f'{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (other processes add noise)')
    ratio = medians['trl'] / medians['ours'] if 'trl' in medians else float('nan')
    print(f'ratio_trl_over_ours_step_time={ratio:.4f}')


if __name__ == '__main__':
    main()
