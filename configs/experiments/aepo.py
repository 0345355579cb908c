# AEPO (QwenLong-L1.5) on the method-comparison testbed
# (configs/_base_/tiny_cpu_grid.py; tools/run_experiments.py runs it over seeds).
# Its thresholds were never published; the algorithm base's entropy_low 0.6 lies inside this
# policy's range (token-mean entropy/policy 0.69 at the warm start, about 0.55 after 80 GRPO
# steps), so the gate trains on positive samples only while the batch entropy is above 0.6.
_base_ = ['../_base_/tiny_cpu_grid.py', '../_base_/algorithms/aepo.py']

model = dict(policy_loss={{_base_.policy_loss}})
train_cfg = dict(advantage={{_base_.advantage}},
                 max_tokens_per_micro_batch={{_base_.micro_batch_tokens}})
