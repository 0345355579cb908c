# Intern-S1-mini: GEPO with the paper's hyperparameters (section 3.1): alpha_high 0.2,
# alpha_low 0.5, beta_high 0.3, beta_low 0.2, gamma 0.01 (configs/_base_/algorithms/gepo.py).
#
#   GEPO_MODEL_PATH=/path/to/Intern-S1-mini GEPO_DATA_DIR=/path/to/data \
#   xtuner train configs/gepo_intern_s1_mini.py --deepspeed deepspeed_zero2
#
# Data layout, multi-GPU and Slurm launches: docs/cluster.md.
_base_ = ['./_base_/models/intern_s1_mini.py', './_base_/algorithms/gepo.py']

model = dict(policy_loss={{_base_.policy_loss}})
train_cfg = dict(advantage={{_base_.advantage}},
                 max_tokens_per_micro_batch={{_base_.micro_batch_tokens}})
