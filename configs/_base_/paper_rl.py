# The paper's shared RL setting (GEPO paper, section 3.1 "Settings"): K = 16 responses per
# prompt at temperature 1, 256 prompts per rollout batch, minibatch 32, CISPO importance-weight
# clipping (from the algorithm base), LMDeploy rollouts, bf16 weights.
#
# Experiment configs combine two bases: one model base (configs/_base_/models/, which builds
# on this file and adds what loading its policy needs) and one algorithm base
# (configs/_base_/algorithms/), and wire the algorithm's `advantage` and `policy_loss` into
# train_cfg and model. `custom_imports` comes from the algorithm base: mmengine refuses the
# same top-level key in two bases.
#
# Values the paper does not give are marked "not in the paper"; docs/cluster.md lists them.
# Launch with `--deepspeed deepspeed_zero2`: bf16 weights need DeepSpeed's fp32 master copy
# (a plain AdamW step on bf16 weights rounds lr-1e-6 updates away), and with it a 9B policy's
# training state (about 144 GB) needs ZeRO to shard it across the GPUs.
_base_ = ['./rl_runtime.py']  # hooks, logging, visualizer, env (NCCL)
runner_type = 'RLRunner'

# ---- config variables: environment variables read when the config is loaded ----
model_path = '{{$GEPO_MODEL_PATH:}}'  # required: Hugging Face directory of the base model
data_dir = '{{$GEPO_DATA_DIR:}}'  # required: directory holding train.jsonl and val.jsonl
lmdeploy_url = '{{$GEPO_LMDEPLOY_URL:launch}}'  # URL of a separate LMDeploy server, or launch
lmdeploy_python = '{{$GEPO_LMDEPLOY_PYTHON:python}}'  # interpreter with LMDeploy (launch)
lmdeploy_tp = int('{{$GEPO_LMDEPLOY_TP:1}}')  # GPUs of the separate server (its --tp)
master_addr = '{{$MASTER_ADDR:127.0.0.1}}'  # host of training rank 0, as the launcher sets it
sync_port = int('{{$GEPO_WEIGHT_SYNC_PORT:29600}}')  # NCCL weight-sync port on rank 0's host
# Number of training processes as the launcher reports it: torchrun sets WORLD_SIZE, srun
# sets SLURM_NTASKS; neither means one process. The global batch stays 256 prompts whatever
# the GPU count; train_dataloader.batch_size below is its per-rank share.
world_size = (int('{{$WORLD_SIZE:0}}')  # set by torchrun
              or int('{{$SLURM_NTASKS:0}}')  # set by srun
              or 1)

# ---- the paper's batch geometry (section 3.1) ----
num_responses = 16  # K: "sample 16 responses per prompt"
rollout_batch_prompts = 256  # "batch size of 256": prompts per RL step, all ranks together
minibatch_prompts = 32  # "minibatch size of 32": prompts per optimizer step, all ranks
# Both sizes count prompts, as verl and XTuner count them: 256 / 32 = 8 optimizer steps per
# rollout batch, each on 32 x 16 = 512 responses.
# A world size that does not divide them is refused when the loop is built
# (train_cfg.prompts_per_step / minibatch_responses below; tools/check_config.py reports it).
prompts_per_rank = rollout_batch_prompts // world_size
minibatch_per_rank = minibatch_prompts * num_responses // world_size  # responses
# Micro-batches are formed by a token budget per forward/backward (train_cfg's
# max_tokens_per_micro_batch, from the algorithm base: 20480, or the Clip-Cov / KL-Cov authors'
# 20480 / 30720). The loop accumulates their gradients into one optimizer step per minibatch
# itself: optim_wrapper sets no accumulative_counts.
max_response_tokens = 16384  # not in the paper

model = dict(
    type='RLPolicy',
    pretrained=model_path,
    torch_dtype='bfloat16',
    # policy_loss: set by the experiment config from its algorithm base
)

train_dataloader = dict(
    batch_size=prompts_per_rank,  # per rank; x world_size = 256 prompts
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='list_collate'),
    dataset=dict(type='PromptDataset', path=data_dir + '/train.jsonl'))

if lmdeploy_url == 'launch':
    # Training rank 0 starts one server on its own GPU (tp 1); every rank sends it requests.
    # New weights go over CUDA IPC, and the server sleeps while the trainer updates.
    rollout_server = dict(
        launch=dict(model_path=model_path, host=master_addr, port=23333, backend='pytorch',
                    tp=1, python=lmdeploy_python),
        weight_sync=dict(mode='ipc'),
        sleep_wake=True)
else:
    # A server on other GPUs (tools/slurm_lmdeploy_server.sh): weights are broadcast over
    # NCCL from training rank 0, which hosts the rendezvous at master_addr:sync_port.
    rollout_server = dict(
        server_url=lmdeploy_url,
        weight_sync=dict(mode='nccl', master_address=master_addr, master_port=sync_port,
                         server_tp=lmdeploy_tp))

train_cfg = dict(
    type='RLTrainLoop',
    max_steps=300,  # not in the paper; its validation curves go past step 170
    num_responses=num_responses,
    # advantage: set by the experiment config from its algorithm base
    rollout=dict(
        type='LMDeployRolloutBackend',
        max_concurrency=256,  # requests in flight per rank
        timeout_s=3600.0,  # per request: long reasoning responses take minutes
        **rollout_server),
    # reward routed by each record's `domain` field; an unknown domain stops the step
    rewards=dict(
        math=dict(type='MathReward'),
        physics=dict(type='NumericReward'),
        science=dict(type='MultipleChoiceReward'),
        # policy-written programs: refuse to start without file-system containment
        # (bwrap or Landlock; docs/rewards.md) rather than run them unconfined
        code=dict(type='CodeReward', min_containment='contained'),
        instruction=dict(type='InstructionFollowingReward'),
        chart=dict(type='ChartQAReward')),
    sampling=dict(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_response_tokens),
    prompt_template='{prompt}',  # records hold prompts with the chat template applied
    minibatch_responses_per_rank=minibatch_per_rank,
    prompts_per_step=rollout_batch_prompts,  # checked: batch_size x world size
    minibatch_responses=minibatch_prompts * num_responses,  # checked: per rank x world
    # max_tokens_per_micro_batch: set by the experiment config from its algorithm base
    ppo_epochs=1,
    val=dict(path=data_dir + '/val.jsonl', interval=10))  # greedy; interval not in the paper

optim_wrapper = dict(
    type='OptimWrapper',  # --deepspeed swaps in DeepSpeedOptimWrapper with this optimizer
    optimizer=dict(type='AdamW', lr=1e-6, betas=(0.9, 0.999), weight_decay=0.01),  # not in paper
    clip_grad=dict(max_norm=1.0))

default_hooks = dict(checkpoint=dict(interval=20))  # the rest: _base_/rl_runtime.py
# Multimodal checkpoints carry a vision tower that text-only batches leave without gradients.
find_unused_parameters = True
