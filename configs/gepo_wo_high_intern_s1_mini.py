# Intern-S1-mini: GEPO ablation "w/o high entropy control" (section 3.2 "Ablation Study",
# Table 2): alpha_high = 1 leaves negative advantages of high-entropy groups unscaled;
# everything else as in GEPO.
#
#   GEPO_MODEL_PATH=/path/to/Intern-S1-mini GEPO_DATA_DIR=/path/to/data \
#   xtuner train configs/gepo_wo_high_intern_s1_mini.py --deepspeed deepspeed_zero2
#
# Data layout, multi-GPU and Slurm launches: docs/cluster.md.
_base_ = ['./_base_/models/intern_s1_mini.py', './_base_/algorithms/gepo_wo_high.py']

model = dict(policy_loss={{_base_.policy_loss}})
train_cfg = dict(advantage={{_base_.advantage}},
                 max_tokens_per_micro_batch={{_base_.micro_batch_tokens}})
