"""Qwen3.5-9B text RL with GEPO on XTuner v1's colocated RL trainer (Ray + LMDeploy).

GEPO's paper settings (section 3.1): K = 16 responses per prompt at temperature 1, 256
prompts per rollout batch, minibatches of 32 prompts (8 optimizer steps per batch); GEPO's
alpha / beta / gamma are GEPOAdvantageConfig's defaults, GEPOAdvantage's (the paper's).
Differences from the paper's setting and from this project's legacy-XTuner config
(configs/gepo_qwen3_5_9b.py) are listed in docs/xtuner_v1.md: v1's policy loss is
PPO clip, not CISPO.

Required env:
  WORK_DIR, MODEL_PATH (local Qwen3.5-9B), DATA_PATH, EVAL_DATA_PATH (v1's RL jsonl)

Launch (XTuner v1 source install, with gepo-xtuner installed --no-deps next to it)::

  export XTUNER_USE_LMDEPLOY=1
  ray start --head
  python xtuner/v1/train/cli/rl.py --config configs/xtuner_v1/gepo_qwen3_5_9b.py
"""

import json
import os
from pathlib import Path

from xtuner.v1.config import AdamWConfig, FSDPConfig, LRConfig
from xtuner.v1.data_proto.rl_data import SampleParams
from xtuner.v1.datasets.config import DataloaderConfig, DatasetConfig
from xtuner.v1.datasets.rl_tokenize_fn import RLTextTokenizeFnConfig
from xtuner.v1.model import Qwen3_5_VLDense4BConfig
from xtuner.v1.model.compose.qwen3_5.qwen3_5_config import Qwen3_5_ProjectorConfig, Qwen3_5_VisionConfig
from xtuner.v1.rl.agent_loop import SingleTurnAgentLoopConfig
from xtuner.v1.rl.agent_loop_manager import AgentLoopManagerConfig, SamplerConfig, TaskSpecConfig
from xtuner.v1.rl.evaluator import EvaluatorConfig
from xtuner.v1.rl.judger import GSM8KJudgerConfig
from xtuner.v1.rl.loss import GRPOLossConfig
from xtuner.v1.rl.replay_buffer import SyncReplayBufferConfig
from xtuner.v1.rl.rollout.worker import RolloutConfig
from xtuner.v1.rl.trainer import WorkerConfig
from xtuner.v1.rl.utils import AcceleratorResourcesConfig, CPUResourcesConfig

from gepo_xtuner.integrations.xtuner_v1 import GEPOAdvantageConfig, GEPORLColocateTrainerConfig

work_dir = os.environ["WORK_DIR"]
model_path = os.environ["MODEL_PATH"]
data_path = os.environ["DATA_PATH"]
eval_data_path = os.environ["EVAL_DATA_PATH"]
NNODE = int(os.environ.get("WORLD_SIZE", "1"))

# basic settings (GEPO paper, section 3.1; "not in the paper" where marked)
experimental_name = "gepo_qwen3_5_9b"
total_train_steps = 300  # not in the paper
evaluate_step = 20  # not in the paper
prompt_repeat_k = 16  # K
train_batch_size = 256  # prompts per rollout batch
train_optimizer_steps = 8  # 256 / 32: minibatches of 32 prompts
max_prompt_length = 2048  # not in the paper
max_response_length = 16384  # not in the paper
pack_max_length = 32 * 1024

# 1. resources
resources = AcceleratorResourcesConfig(
    accelerator="GPU",
    num_workers=8 * NNODE,
    num_cpus_per_worker=12,
    cpu_memory_per_worker=16 * 1024**3,
)

# 2. rollout (LMDeploy; the rollout logprobs are what GEPO measures entropy from)
rollout_config = RolloutConfig(
    env=experimental_name,
    device=resources.accelerator,
    model_path=model_path,
    dtype="bfloat16",
    tensor_parallel_size=1,
    gpu_memory_utilization=0.8,
    context_length=max_prompt_length + max_response_length,
)

# 3. judger: one math task here; add a TaskSpecConfig (task_name = domain) per domain of
# your data, each with its judger. GEPO logs group entropy per task_name.
judger_config = GSM8KJudgerConfig(
    judger_name="openai/gsm8k",
    cpu_resources=CPUResourcesConfig(num_workers=1, num_cpus_per_worker=1),
)


# 4. train worker. v1 (b934f462) ships Qwen3.5 dense configs for 4B only; the 9B's
# sizes come from the checkpoint's own config.json, on top of v1's 4B config.
def qwen3_5_dense_from_checkpoint(path: str) -> Qwen3_5_VLDense4BConfig:
    hf = json.loads((Path(path) / "config.json").read_text())
    text, vision = hf["text_config"], hf["vision_config"]
    base = Qwen3_5_VLDense4BConfig()
    text_config = base.text_config.model_copy(
        update=dict(
            vocab_size=text["vocab_size"],
            num_hidden_layers=text["num_hidden_layers"],
            hidden_size=text["hidden_size"],
            intermediate_size=text["intermediate_size"],
            tie_word_embeddings=hf.get("tie_word_embeddings", text["tie_word_embeddings"]),
            attention=base.text_config.attention.model_copy(
                update=dict(
                    num_attention_heads=text["num_attention_heads"],
                    num_key_value_heads=text["num_key_value_heads"],
                    head_dim=text["head_dim"],
                )
            ),
            linear_attention=base.text_config.linear_attention.model_copy(
                update=dict(
                    num_value_heads=text["linear_num_value_heads"],
                    num_key_heads=text["linear_num_key_heads"],
                    key_head_dim=text["linear_key_head_dim"],
                    value_head_dim=text["linear_value_head_dim"],
                    conv_kernel_dim=text["linear_conv_kernel_dim"],
                )
            ),
        )
    )
    return Qwen3_5_VLDense4BConfig(
        vision_config=Qwen3_5_VisionConfig(
            depth=vision["depth"], hidden_size=vision["hidden_size"], intermediate_size=vision["intermediate_size"]
        ),
        projector_config=Qwen3_5_ProjectorConfig(
            vision_hidden_size=vision["hidden_size"], text_hidden_size=text["hidden_size"]
        ),
        text_config=text_config,
    )


model_cfg = qwen3_5_dense_from_checkpoint(model_path)
model_cfg.only_llm_forward = True  # text RL: skip the vision tower
optim_cfg = AdamWConfig(lr=1e-6, foreach=False, weight_decay=0.01)  # not in the paper
loss_cfg = GRPOLossConfig(
    policy_loss_cfg=dict(cliprange_high=0.28, cliprange_low=0.2, loss_type="vanilla"),
    ignore_idx=-100,
    use_kl_loss=False,
    mode="chunk",
    chunk_size=512,
)
train_worker_cfg = WorkerConfig(
    model_cfg=model_cfg,
    load_from=model_path,
    optim_cfg=optim_cfg,
    loss_cfg=loss_cfg,
    lr_cfg=LRConfig(lr_type="constant", warmup_ratio=0, lr_min=1e-6),
    fsdp_cfg=FSDPConfig(torch_compile=False, cpu_offload=False),
    optimizer_steps=train_optimizer_steps,
    pack_max_length=pack_max_length,
)

# 5. train agent loop manager
tokenizer_config = RLTextTokenizeFnConfig(max_length=max_prompt_length)
dataloader_cfg = DataloaderConfig(
    dataset_config_list=[
        {"dataset": DatasetConfig(name=experimental_name, anno_path=data_path), "tokenize_fn": tokenizer_config}
    ],
    pack_max_length=pack_max_length,
    collator="fake_collator",
    pack_level="none",
)
training_sample_params = SampleParams(
    max_tokens=max_response_length,
    top_k=0,
    top_p=1.0,
    temperature=1.0,
    return_logprob=True,  # GEPO's group entropy: sum(-logprob) / tokens
)
agent_loop_manager_cfg = AgentLoopManagerConfig(
    tasks=TaskSpecConfig(
        task_name="math",
        agent_loop_config=SingleTurnAgentLoopConfig(hf_checkpoint=model_path, sample_params=training_sample_params),
        judger_config=judger_config,
        sampler_config=SamplerConfig(dataloader_cfg=dataloader_cfg, prompt_repeat_k=prompt_repeat_k),
    ),
)

# 6. eval agent loop manager (avg@1, greedy)
eval_dataloader_cfg = DataloaderConfig(
    dataset_config_list=[
        {
            "dataset": DatasetConfig(name=experimental_name, anno_path=eval_data_path, sample_ratio=1.0),
            "tokenize_fn": tokenizer_config,
        }
    ],
    pack_max_length=pack_max_length,
    collator="fake_collator",
    pack_level="none",
)
eval_agent_loop_manager_cfg = AgentLoopManagerConfig(
    tasks=TaskSpecConfig(
        task_name="eval_math",
        agent_loop_config=SingleTurnAgentLoopConfig(
            hf_checkpoint=model_path,
            sample_params=SampleParams(max_tokens=max_response_length, top_k=1, top_p=1.0, temperature=0.0),
        ),
        judger_config=judger_config,
        sampler_config=SamplerConfig(dataloader_cfg=eval_dataloader_cfg, prompt_repeat_k=1),
    ),
)

# 7. trainer: GEPO needs the trainer with the batch-level pass (GEPORLColocateTrainerConfig);
# its entropy band is saved as gepo_threshold_state.json in every ckpt-step-N/.
trainer = GEPORLColocateTrainerConfig(
    resources=resources,
    train_worker_cfg=train_worker_cfg,
    rollout_config=rollout_config,
    tokenizer_path=model_path,
    replay_buffer_config=SyncReplayBufferConfig(),
    agent_loop_manager_cfg=agent_loop_manager_cfg,
    eval_agent_loop_manager_cfg=eval_agent_loop_manager_cfg,
    evaluator_config=EvaluatorConfig(compute_metric_func=None),
    load_from=model_path,
    total_train_steps=total_train_steps,
    train_batch_size=train_batch_size,
    advantage_estimator_config=GEPOAdvantageConfig(),
    enable_evaluate=True,
    enable_initial_evaluate=True,
    evaluate_step=evaluate_step,
    checkpoint_interval=20,
    auto_resume=True,
    work_dir=work_dir,
    seed=123,
    exp_tracker="jsonl",
)
