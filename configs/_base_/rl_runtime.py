# Runtime parts every RL config here shares: hooks, logging, visualizer, environment.
# The including config sets the checkpoint interval and the process-group backend.
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=1),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(
        type='CheckpointHook',
        interval=50,
        by_epoch=False,
        max_keep_ckpts=2,
        backend_args=dict(backend='atomic_local')),  # a kill during a save loses nothing
    # named alarms (length collapse, entropy, GEPO's band, rollout drift, reward without
    # validation): action='warn' prints them, 'stop' checkpoints and exits with status 3
    health=dict(type='RunHealthHook', action='warn'))
# The RL loop owns and checkpoints its run state itself (processor state, RNG, history).
custom_hooks = [dict(type='TrainingCurvesHook')]

log_processor = dict(type='RLLogProcessor', window_size=1)
visualizer = dict(
    type='Visualizer',
    vis_backends=[dict(type='LocalVisBackend'),
                  dict(type='OptionalTensorboardVisBackend')])

env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'))
randomness = dict(seed=0, deterministic=False)
launcher = 'none'
load_from = None
resume = False
log_level = 'INFO'
