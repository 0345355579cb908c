# KL-Cov baseline with the authors' Qwen2.5-7B parameters (arXiv 2505.22617): the top
# 0.2 % of tokens by covariance get a penalty 1.0 * |logp - logp_old|.
# importance='cispo' applies CISPO weight clipping, as the GEPO paper did for baselines.
custom_imports = dict(imports=['gepo_xtuner'], allow_failed_imports=False)

advantage = dict(type='GRPOAdvantage', eps=1e-8)
policy_loss = dict(
    type='KLCovLoss', kl_cov_ratio=0.002, ppo_kl_coef=1.0, importance='cispo', eps_low=1.0,
    eps_high=4.0)
# the authors' token budget per GPU micro-batch (recipe/dapo/7b_kl_cov.sh, use_dynamic_bsz):
# KL-Cov's covariance is centred over the tokens of one micro-batch
micro_batch_tokens = 30720
