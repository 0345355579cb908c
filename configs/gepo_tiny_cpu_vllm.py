# The demo (configs/gepo_tiny_cpu.py: the tiny policy, the four-domain task mix, GEPO) with its
# rollouts from a vLLM server instead of the trainer's own model copy: the run starts
# `vllm serve` on the warm-started policy (the interpreter of `make vllm-env`) and, after every
# step, pushes the new weights into it without a restart, each push proven by a logprob probe
# (docs/vllm.md). `make demo-vllm` runs it.
_base_ = ['./gepo_tiny_cpu.py']

tiny_dir = '{{$GEPO_TINY_DIR:work_dirs/tiny_cpu}}'
vllm_python = '{{$GEPO_VLLM_PYTHON:work_dirs/vllm_env/bin/python}}'

train_cfg = dict(rollout=dict(
    _delete_=True,
    type='VLLMRolloutBackend',
    launch=dict(model_path=tiny_dir + '/model', python=vllm_python, port=0,
                max_model_len=128,  # the policy's max_position_embeddings
                dtype='float32', kv_cache_gib=1),
    # weights through /dev/shm; the server's logprobs of a probe must match the trainer's
    weight_sync=dict(mode='disk', probe_tolerance=1e-3)))
