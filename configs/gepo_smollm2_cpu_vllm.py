# configs/gepo_smollm2_cpu.py (SmolLM2-135M-Instruct, GSM8K / instruction / code mixture) with
# its rollouts from a vLLM server that the run starts (the interpreter of `make vllm-env`) and
# pushes the weights into after every step, each push proven by a logprob probe (docs/vllm.md).
#   GEPO_SMOLLM2_DIR=work_dirs/smollm2 .venv/bin/python -m xtuner.tools.train \
#       configs/gepo_smollm2_cpu_vllm.py --work-dir work_dirs/gepo_smollm2_cpu_vllm
_base_ = ['./gepo_smollm2_cpu.py']

smollm2_dir = '{{$GEPO_SMOLLM2_DIR:work_dirs/smollm2}}'
vllm_python = '{{$GEPO_VLLM_PYTHON:work_dirs/vllm_env/bin/python}}'

train_cfg = dict(rollout=dict(
    _delete_=True,
    type='VLLMRolloutBackend',
    launch=dict(model_path=smollm2_dir + '/model', python=vllm_python, port=0,
                max_model_len=1024, dtype='float32', kv_cache_gib=2),
    weight_sync=dict(mode='disk', probe_tolerance=1e-3)))
