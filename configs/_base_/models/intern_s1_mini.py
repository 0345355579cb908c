# Intern-S1-mini (paper section 3.1): multimodal reasoning model, an 8B Qwen3 language model
# with an InternViT vision encoder; Hugging Face id internlm/Intern-S1-mini (custom code).
# GEPO_MODEL_PATH must point at a local copy; tools/check_config.py compares the model_type
# in its config.json with the one below and refuses an environment that cannot load it.
#
# Loading (docs/multimodal.md, "Which environment loads Intern-S1-mini"): the checkpoint's own
# code (trust_remote_code) on transformers >= 4.53, i.e. the transformers-5 overlay next to
# xtuner 0.2.0 (docs/transformers5.md); its auto_map loads the whole VLM through
# AutoModelForCausalLM, and its AutoProcessor (image tiles, the <img>/<IMG_CONTEXT> prompt
# expansion) encodes image records. A launched LMDeploy server follows the policy and gets
# --trust-remote-code.
_base_ = ['../paper_rl.py']
policy_name = 'Intern-S1-mini'
policy_model_type = 'interns1'

model = dict(
    model_class='AutoModelForCausalLM',  # the checkpoint's auto_map: the whole VLM
    processor={{_base_.model_path}},  # image records need its processor
    trust_remote_code=True)
