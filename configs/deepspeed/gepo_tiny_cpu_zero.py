# GEPO on the built-in CPU setting, with the training state sharded by DeepSpeed ZeRO through
# mmengine's FlexibleRunner (docs/cluster.md). Needs DeepSpeed (make deepspeed-deps) on
# PYTHONPATH; on CPU, DS_ACCELERATOR=cpu. Two processes:
#   PYTHONPATH=$PWD/work_dirs/deepspeed_deps DS_ACCELERATOR=cpu NPROC_PER_NODE=2 \
#       TORCH_EXTENSIONS_DIR=$PWD/work_dirs/deepspeed_deps/torch_extensions \
#       xtuner train configs/deepspeed/gepo_tiny_cpu_zero.py
# (TORCH_EXTENSIONS_DIR: the shared-memory collective the overlay compiled.)
# GEPO_ZERO_STAGE picks ZeRO-2 (default) or ZeRO-3. Not `xtuner train --deepspeed`: that
# replaces the runner and strategy with mmengine's own, which needs CUDA and leaves the hooks'
# state (GEPO's entropy band, the loop's RNG) out of checkpoints.
_base_ = ['../gepo_tiny_cpu.py']

zero_stage = int('{{$GEPO_ZERO_STAGE:2}}')
runner_type = 'RLFlexibleRunner'
strategy = dict(
    type='RLDeepSpeedStrategy',
    config=dict(
        zero_optimization=dict(stage=zero_stage),
        gradient_clipping=1.0,  # the clip_grad of the base config's optim_wrapper
        gradient_accumulation_steps=1,  # the loop accumulates micro-batches itself
        zero_allow_untested_optimizer=True,  # torch's AdamW
        zero_force_ds_cpu_optimizer=False))
optim_wrapper = dict(
    _delete_=True,
    type='DeepSpeedOptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0))
