# GRPO on the method-comparison testbed (configs/_base_/tiny_cpu_grid.py).
_base_ = ['../_base_/tiny_cpu_grid.py', '../_base_/algorithms/grpo.py']

model = dict(policy_loss={{_base_.policy_loss}})
train_cfg = dict(advantage={{_base_.advantage}},
                 max_tokens_per_micro_batch={{_base_.micro_batch_tokens}})
