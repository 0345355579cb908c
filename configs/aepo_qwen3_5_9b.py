# Qwen3.5-9B: AEPO baseline (section 3.1; QwenLong-L1.5). Its entropy thresholds were never
# published: the project defaults in configs/_base_/algorithms/aepo.py need tuning to
# the model's entropy scale (read entropy/policy from a GRPO run).
#
#   GEPO_MODEL_PATH=/path/to/Qwen3.5-9B GEPO_DATA_DIR=/path/to/data \
#   xtuner train configs/aepo_qwen3_5_9b.py --deepspeed deepspeed_zero2
#
# Data layout, multi-GPU and Slurm launches: docs/cluster.md.
_base_ = ['./_base_/models/qwen3_5_9b.py', './_base_/algorithms/aepo.py']

model = dict(policy_loss={{_base_.policy_loss}})
train_cfg = dict(advantage={{_base_.advantage}},
                 max_tokens_per_micro_batch={{_base_.micro_batch_tokens}})
