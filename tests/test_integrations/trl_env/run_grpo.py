"""One rank of a GEPO run on TRL's GRPOTrainer (started by torchrun from test_trl.py).

Usage: run_grpo.py MODEL_DIR OUT_DIR RECORD_DIR [--resume CHECKPOINT] [--steps N]

Trains the tiny random policy with :class:`~gepo_xtuner.integrations.trl.GEPOGRPOTrainer`
on CPU (gloo) and writes, per rank and step, ``RECORD_DIR/step{S}_rank{R}.json``: this
rank's rows as TRL computed them before GEPO (its advantages, the logprobs GEPO read and
their mask), the shaped advantages TRL trains on, the gathered rewards and the band after
the step. The test rebuilds the global batch from these files alone.
"""

import argparse
import json
import sys
from pathlib import Path

# bitsandbytes 0.45 (installed beside legacy xtuner in this project's environment) fails
# to import with triton >= 3.2, and TRL imports it when it is there; it is unused here
sys.modules.setdefault('bitsandbytes', None)

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from gepo_xtuner.integrations.trl import GEPOGRPOTrainer  # noqa: E402

_torch_load = torch.load


def _load_on_cpu(*args, map_location=None, **kwargs):
    """transformers' Trainer resumes the optimizer of a multi-process run with
    ``map_location=args.device``, which on CPU is ``cpu:<rank>``, a location torch.load
    cannot restore (GPU runs get ``cuda:<rank>``); CPU is CPU."""
    if isinstance(map_location, torch.device) and map_location.type == 'cpu':
        map_location = 'cpu'
    return _torch_load(*args, map_location=map_location, **kwargs)


torch.load = _load_on_cpu

#: 3 rows per process and 2 completions per prompt: the middle group is split between
#: rank 0 (its first row) and rank 1 (its second)
PER_DEVICE, K = 3, 2
GEPO = dict(alpha_low=0.5, alpha_high=0.2, beta_low=0.2, beta_high=0.3, gamma=0.5)


def digits(completions: list[str], **_: object) -> list[float]:
    """Share of digits in the completion: varied rewards from a random policy."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


class Recording(GEPOGRPOTrainer):
    """Writes what each step saw and produced (see module)."""

    def __init__(self, *args, record_dir: Path, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.record_dir = record_dir
        self._seen: dict = {}

    def _gepo_logprobs(self, out):
        logprobs, mask = super()._gepo_logprobs(out)
        self._seen = dict(base=out['advantages'].tolist(), logprobs=logprobs.tolist(),
                          mask=mask.tolist())
        return logprobs, mask

    def _calculate_rewards(self, *args):
        rewards = super()._calculate_rewards(*args)
        self._seen_rewards = rewards.tolist()
        return rewards

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        step = self.state.global_step + 1
        record = dict(self._seen, shaped=out['advantages'].tolist(),
                      rewards_per_func=self._seen_rewards, state=self.gepo_state.state_dict(),
                      reward_weights=self.reward_weights.tolist())
        path = self.record_dir / f'step{step}_rank{self.accelerator.process_index}.json'
        path.write_text(json.dumps(record))
        return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('model')
    parser.add_argument('out')
    parser.add_argument('records')
    parser.add_argument('--resume')
    parser.add_argument('--steps', type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    records = Path(args.records)
    records.mkdir(parents=True, exist_ok=True)
    rows = [dict(prompt=f'{a} plus {b} is') for a in range(5) for b in range(5)]
    config = GRPOConfig(
        output_dir=args.out, use_cpu=True, bf16=False, fp16=False, seed=0, data_seed=0,
        per_device_train_batch_size=PER_DEVICE, gradient_accumulation_steps=1,
        steps_per_generation=1, num_generations=K, max_completion_length=6, temperature=1.0,
        learning_rate=5e-3, beta=0.0, max_steps=args.steps, save_strategy='steps', save_steps=1,
        logging_steps=1, report_to='none', disable_tqdm=True, use_vllm=False,
        ddp_backend='gloo', dataloader_num_workers=0)
    trainer = Recording(
        model=AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32),
        reward_funcs=digits, args=config, train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(args.model), gepo=GEPO,
        record_dir=records)
    trainer.remove_callback(PrinterCallback)
    trainer.train(resume_from_checkpoint=args.resume)
    if trainer.accelerator.is_main_process:
        logged = [{k: v for k, v in row.items() if k.startswith(('gepo/', 'shaping/'))}
                  for row in trainer.state.log_history]
        (records / 'log_history.json').write_text(json.dumps(logged))


if __name__ == '__main__':
    main()
