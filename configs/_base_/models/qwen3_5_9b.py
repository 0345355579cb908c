# Qwen3.5-9B (paper section 3.1). Its model_type `qwen3_5` needs transformers 5.x; the
# transformers 4.48 that xtuner 0.2.0 pins cannot load it (see docs/cluster.md).
# GEPO_MODEL_PATH must point at a local copy; tools/check_config.py compares the model_type
# in its config.json with the one below and refuses an environment that cannot load it.
_base_ = ['../paper_rl.py']
policy_name = 'Qwen3.5-9B'
policy_model_type = 'qwen3_5'
