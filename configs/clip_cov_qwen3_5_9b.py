# Qwen3.5-9B: Clip-Cov baseline with the authors' Qwen2.5-7B parameters, as the paper used
# them (section 3.1; configs/_base_/algorithms/clip_cov.py).
#
#   GEPO_MODEL_PATH=/path/to/Qwen3.5-9B GEPO_DATA_DIR=/path/to/data \
#   xtuner train configs/clip_cov_qwen3_5_9b.py --deepspeed deepspeed_zero2
#
# Data layout, multi-GPU and Slurm launches: docs/cluster.md.
_base_ = ['./_base_/models/qwen3_5_9b.py', './_base_/algorithms/clip_cov.py']

model = dict(policy_loss={{_base_.policy_loss}})
train_cfg = dict(advantage={{_base_.advantage}},
                 max_tokens_per_micro_batch={{_base_.micro_batch_tokens}})
