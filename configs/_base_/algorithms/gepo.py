# GEPO with the paper's hyperparameters (section 3) and CISPO importance-weight clipping.
# Pure-dict config: string types resolve through gepo_xtuner's registries.
custom_imports = dict(imports=['gepo_xtuner'], allow_failed_imports=False)

advantage = dict(
    type='GEPOAdvantage',
    alpha_low=0.5,  # scale of positive advantages in low-entropy groups
    alpha_high=0.2,  # scale of negative advantages in high-entropy groups
    beta_low=0.2,  # H_low = mu - beta_low * sigma
    beta_high=0.3,  # H_high = mu + beta_high * sigma
    gamma=0.01,  # EMA rate of the thresholds
)

# CISPO bounds: no lower bound (eps_low=1 -> weight >= 0), upper bound 1 + eps_high.
policy_loss = dict(type='CISPOLoss', eps_low=1.0, eps_high=4.0, agg='token-mean')
# tokens per forward/backward micro-batch (memory; not in the paper)
micro_batch_tokens = 20480
