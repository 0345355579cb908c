# AEPO (QwenLong-L1.5) on the method-comparison testbed
# (configs/_base_/tiny_cpu_grid.py; tools/run_experiments.py runs it over seeds).
# Its thresholds were never published. The gate reads the batch's token-mean entropy
# (aepo/batch_policy_entropy), which on this testbed falls from about 0.65 to 0.25 over a run: with
# the algorithm base's entropy_low 0.6 it opened in 1 to 3 of 80 steps (AEPO was GRPO). 0.4,
# the middle of that range, trains on positive samples only while the entropy is above it.
_base_ = ['../_base_/tiny_cpu_grid.py', '../_base_/algorithms/aepo.py']

model = dict(policy_loss={{_base_.policy_loss}})
train_cfg = dict(advantage=dict(type='AEPOAdvantage', entropy_low=0.4, entropy_high=None,
                                gate='band'),
                 max_tokens_per_micro_batch={{_base_.micro_batch_tokens}})
