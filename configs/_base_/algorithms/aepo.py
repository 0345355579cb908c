# AEPO baseline (QwenLong-L1.5): GRPO advantages behind a batch-entropy gate, as the authors'
# released code applies it: while the batch's token-mean policy entropy lies in
# (entropy_low, entropy_high), only responses with positive advantage and reward are trained on.
# No thresholds were published; tune them to your model's entropy scale (`entropy/policy`).
custom_imports = dict(imports=['gepo_xtuner'], allow_failed_imports=False)

advantage = dict(type='AEPOAdvantage', entropy_low=0.6, entropy_high=None, gate='band')
policy_loss = dict(type='CISPOLoss', eps_low=1.0, eps_high=4.0, agg='token-mean')
# tokens per forward/backward micro-batch (memory; not in the paper)
micro_batch_tokens = 20480
