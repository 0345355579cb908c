# Intern-S1-mini: KL-Cov baseline with the authors' Qwen2.5-7B parameters, as the paper used
# them (section 3.1; configs/_base_/algorithms/kl_cov.py).
#
#   GEPO_MODEL_PATH=/path/to/Intern-S1-mini GEPO_DATA_DIR=/path/to/data \
#   xtuner train configs/kl_cov_intern_s1_mini.py --deepspeed deepspeed_zero2
#
# Data layout, multi-GPU and Slurm launches: docs/cluster.md.
_base_ = ['./_base_/models/intern_s1_mini.py', './_base_/algorithms/kl_cov.py']

model = dict(policy_loss={{_base_.policy_loss}})
train_cfg = dict(advantage={{_base_.advantage}},
                 max_tokens_per_micro_batch={{_base_.micro_batch_tokens}})
