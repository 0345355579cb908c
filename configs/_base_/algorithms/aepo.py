# AEPO baseline (QwenLong-L1.5): GRPO advantages behind a batch-entropy gate.
# No thresholds were published; tune them to your model's entropy scale.
custom_imports = dict(imports=['gepo_xtuner'], allow_failed_imports=False)

advantage = dict(type='AEPOAdvantage', entropy_low=0.4, entropy_high=0.6)
policy_loss = dict(type='CISPOLoss', eps_low=1.0, eps_high=4.0, agg='token-mean')
