# Intern-S1-mini: GEPO ablation "w/o asymmetric advantage shaping" (section 3.2
# "Ablation Study", Table 2): alpha_low = alpha_high. The paper gives no value; 0.2
# keeps the high-entropy side as in GEPO and drops the "gentler nudge" of
# alpha_low 0.5 (section 2.3).
#
#   GEPO_MODEL_PATH=/path/to/Intern-S1-mini GEPO_DATA_DIR=/path/to/data \
#   xtuner train configs/gepo_symmetric_intern_s1_mini.py --deepspeed deepspeed_zero2
#
# Data layout, multi-GPU and Slurm launches: docs/cluster.md.
_base_ = ['./_base_/models/intern_s1_mini.py', './_base_/algorithms/gepo_symmetric.py']

model = dict(policy_loss={{_base_.policy_loss}})
train_cfg = dict(advantage={{_base_.advantage}},
                 max_tokens_per_micro_batch={{_base_.micro_batch_tokens}})
