# GRPO baseline. The paper applies CISPO importance-weight clipping to every baseline;
# for DAPO-style PPO clipping use dict(type='PPOClipLoss', clip_low=0.2, clip_high=0.28).
custom_imports = dict(imports=['gepo_xtuner'], allow_failed_imports=False)

advantage = dict(type='GRPOAdvantage', eps=1e-8)
policy_loss = dict(type='CISPOLoss', eps_low=1.0, eps_high=4.0, agg='token-mean')
# tokens per forward/backward micro-batch (memory; not in the paper)
micro_batch_tokens = 20480
