# Clip-Cov with its authors' parameters on the method-comparison testbed
# (configs/_base_/tiny_cpu_grid.py; tools/run_experiments.py runs it over seeds).
_base_ = ['../_base_/tiny_cpu_grid.py', '../_base_/algorithms/clip_cov.py']

model = dict(policy_loss={{_base_.policy_loss}})
train_cfg = dict(advantage={{_base_.advantage}},
                 max_tokens_per_micro_batch={{_base_.micro_batch_tokens}})
