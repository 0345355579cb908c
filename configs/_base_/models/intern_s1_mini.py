# Intern-S1-mini (paper section 3.1): multimodal reasoning model, an 8B Qwen3 language model
# with an InternViT vision encoder; Hugging Face id internlm/Intern-S1-mini (custom code).
# GEPO_MODEL_PATH must point at a local copy; tools/check_config.py compares the model_type
# in its config.json with the one below.
policy_name = 'Intern-S1-mini'
policy_model_type = 'interns1'
