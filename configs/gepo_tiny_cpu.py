# GEPO on the built-in CPU setting (make demo). Hyperparameters as in the paper; the
# threshold state belongs to the RL loop and is checkpointed with it.
_base_ = ['./_base_/tiny_cpu.py']
custom_imports = dict(imports=['gepo_xtuner'], allow_failed_imports=False)

train_cfg = dict(
    advantage=dict(
        _delete_=True,
        type='GEPOAdvantage',
        alpha_low=0.5,
        alpha_high=0.2,
        beta_low=0.2,
        beta_high=0.3,
        gamma=0.01))
