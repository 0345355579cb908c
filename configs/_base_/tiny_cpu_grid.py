# The method-comparison testbed (tools/run_experiments.py, docs/experiments.md): the built-in
# CPU policy (configs/_base_/tiny_cpu.py: char-level Qwen2, copy/add/sort/mul), warm-started on
# demonstrations of which a share per domain show a systematic mistake (copy 10 %, sort 20 %,
# add 30 %, mul 40 % reversed answers; run_experiments.py prepares it in
# work_dirs/tiny_cpu_grid and points GEPO_TINY_DIR there), with a short RL schedule: one run
# takes a few minutes on ONE core. Experiment configs (configs/experiments/) add one algorithm
# base and wire its `advantage`, `policy_loss` and micro-batch budget in, as the paper
# configs do.
_base_ = ['./tiny_cpu.py']

train_dataloader = dict(batch_size=32)  # B: 32 prompts per step ...
train_cfg = dict(
    max_steps=80,
    num_responses=8,  # ... x K = 8 responses
    minibatch_responses_per_rank=64,  # 4 optimizer steps per RL step
    # all 800 held-out prompts (200 per domain), 2 samples each at temperature 1.0 (avg@2)
    val=dict(interval=20, n=2))

# KL to the warm start 0.1 (0.3 in the demo): the warm start's habit is what RL must unlearn
model = dict(kl_coef=0.1)
optim_wrapper = dict(optimizer=dict(lr=1e-4))
# Adam's first updates have full size lr on every weight, signal or noise: a linear warm-up
# over the first 20 RL steps keeps them from knocking the warm start off course
param_scheduler = [dict(type='LinearLR', start_factor=0.05, by_epoch=False, begin=0, end=20)]
# a checkpoint every 20 steps: a killed run loses at most 20 steps when resumed
default_hooks = dict(checkpoint=dict(interval=20))
