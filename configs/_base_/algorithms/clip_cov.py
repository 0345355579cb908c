# Clip-Cov baseline with the authors' Qwen2.5-7B parameters (arXiv 2505.22617):
# ratio 2e-4 of tokens with covariance in (1, 5) lose their gradient; PPO clip 1.
# importance='cispo' applies CISPO weight clipping, as the GEPO paper did for baselines.
custom_imports = dict(imports=['gepo_xtuner'], allow_failed_imports=False)

advantage = dict(type='GRPOAdvantage', eps=1e-8)
policy_loss = dict(
    type='ClipCovLoss',
    clip_cov_ratio=2e-4,
    clip_cov_lb=1.0,
    clip_cov_ub=5.0,
    clip_low=1.0,
    clip_high=1.0,
    importance='cispo',
    eps_low=1.0,
    eps_high=4.0)
# the authors' token budget per GPU micro-batch (recipe/dapo/7b_clip_cov.sh, use_dynamic_bsz):
# Clip-Cov's covariance is centred over the tokens of one micro-batch
micro_batch_tokens = 20480
