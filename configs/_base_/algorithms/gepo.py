# GEPO with the paper's hyperparameters (section 3) and CISPO importance-weight clipping.
# The paper's values are GEPOAdvantage's defaults (gepo_xtuner/advantage/gepo.py), written
# there once: alpha_low (positive advantages in low-entropy groups), alpha_high (negative
# advantages in high-entropy groups), beta_low / beta_high (band = mu -/+ beta * sigma),
# gamma (EMA rate of the band). The ablations set one of them.
# Pure-dict config: string types resolve through gepo_xtuner's registries.
custom_imports = dict(imports=['gepo_xtuner'], allow_failed_imports=False)

advantage = dict(type='GEPOAdvantage')

# CISPO bounds: no lower bound (eps_low=1 -> weight >= 0), upper bound 1 + eps_high.
policy_loss = dict(type='CISPOLoss', eps_low=1.0, eps_high=4.0, agg='token-mean')
# tokens per forward/backward micro-batch (memory; not in the paper)
micro_batch_tokens = 20480
