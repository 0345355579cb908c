# The built-in CPU setting: a tiny character-level Qwen2 policy, warm-started on a synthetic
# four-domain task mix (copy, add, sort, mul), trained online with the RL loop of gepo_xtuner.
# Needs `python tools/prepare_tiny_cpu.py` first (make demo runs it). Pure-dict config: the
# including config sets `custom_imports` (which registers everything, so `xtuner train` resolves
# the string types below), directly or through an algorithm base (configs/_base_/algorithms/).
_base_ = ['./rl_runtime.py']  # hooks (checkpoints every 50 steps), logging, env
runner_type = 'RLRunner'

# written by tools/prepare_tiny_cpu.py; the environment variable GEPO_TINY_DIR overrides it
tiny_dir = '{{$GEPO_TINY_DIR:work_dirs/tiny_cpu}}'
prompts_per_step = 64  # B, per rank
num_responses = 8  # K

model = dict(
    type='RLPolicy',
    pretrained=tiny_dir + '/model',
    policy_loss=dict(type='CISPOLoss', eps_low=1.0, eps_high=4.0, agg='token-mean'),
    # KL to the warm start: without it, domains whose groups are mostly all-correct
    # (zero advantage, so no gradient of their own) drift while the others learn
    kl_coef=0.3)

train_dataloader = dict(
    batch_size=prompts_per_step,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='list_collate'),
    dataset=dict(type='PromptDataset', path=tiny_dir + '/data/train.jsonl', required=['answer']))

train_cfg = dict(
    type='RLTrainLoop',
    max_steps=150,
    num_responses=num_responses,
    rollout=dict(type='HFRolloutBackend', max_sequences_per_call=256),
    advantage=dict(type='GEPOAdvantage'),  # set by the experiment config
    rewards=dict(default=dict(type='ExactMatchReward')),
    sampling=dict(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=20),  # answers <= 16 chars
    prompt_template='{prompt}=',
    minibatch_responses_per_rank=128,  # 4 optimizer steps per rollout batch of 64 x 8
    ppo_epochs=1,
    # held-out accuracy at the rollout temperature, 4 samples per prompt (avg@4)
    val=dict(path=tiny_dir + '/data/val.jsonl', interval=25, temperature=1.0, n=4))

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0),
    clip_grad=dict(max_norm=1.0))

env_cfg = dict(dist_cfg=dict(backend='gloo'))
# Data parallel on CPU: DDP without device ids (ignored in single-process runs).
model_wrapper_cfg = dict(type='MMDistributedDataParallel', device_ids=None)
