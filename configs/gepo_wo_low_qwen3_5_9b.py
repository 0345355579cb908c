# Qwen3.5-9B: GEPO ablation "w/o low entropy control" (section 3.2 "Ablation Study",
# Table 2): alpha_low = 1 leaves positive advantages of low-entropy groups unscaled;
# everything else as in GEPO.
#
#   GEPO_MODEL_PATH=/path/to/Qwen3.5-9B GEPO_DATA_DIR=/path/to/data \
#   xtuner train configs/gepo_wo_low_qwen3_5_9b.py --deepspeed deepspeed_zero2
#
# Data layout, multi-GPU and Slurm launches: docs/cluster.md.
_base_ = ['./_base_/models/qwen3_5_9b.py', './_base_/algorithms/gepo_wo_low.py']

model = dict(policy_loss={{_base_.policy_loss}})
train_cfg = dict(advantage={{_base_.advantage}},
                 max_tokens_per_micro_batch={{_base_.micro_batch_tokens}})
