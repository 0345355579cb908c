# Dr.GRPO (Liu et al. 2025, arXiv 2503.20783) as its authors ran it: group-mean baseline without
# the std division, PPO clipping, and the loss summed over tokens and divided by a CONSTANT
# (responses x train_cfg.norm_length, by default the generation cap sampling.max_new_tokens)
# instead of each response's own length ('seq-mean-token-sum-norm', verl's name for it).
custom_imports = dict(imports=['gepo_xtuner'], allow_failed_imports=False)

advantage = dict(type='DrGRPOAdvantage')
policy_loss = dict(type='PPOClipLoss', clip_low=0.2, clip_high=0.2, agg='seq-mean-token-sum-norm')
# tokens per forward/backward micro-batch (memory)
micro_batch_tokens = 20480
