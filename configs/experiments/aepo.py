# AEPO (QwenLong-L1.5) on the method-comparison testbed
# (configs/_base_/tiny_cpu_grid.py; tools/run_experiments.py runs it over seeds).
_base_ = ['../_base_/tiny_cpu_grid.py', '../_base_/algorithms/aepo.py']

model = dict(policy_loss={{_base_.policy_loss}})
# AEPO's thresholds were never published, and the algorithm base's entropy_low 0.6 lies above
# this policy's entropy (token-mean entropy/policy of the warm start: 0.39), where the gate
# would never open and AEPO would be GRPO. Here it opens (positive samples only) whenever the
# batch entropy is above the warm start's level; plain GRPO trains below it.
train_cfg = dict(advantage=dict(type='AEPOAdvantage', entropy_low=0.38, entropy_high=None,
                                gate='band'),
                 max_tokens_per_micro_batch={{_base_.micro_batch_tokens}})
