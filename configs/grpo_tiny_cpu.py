# Plain GRPO on the built-in CPU setting: the same run as gepo_tiny_cpu.py without shaping.
_base_ = ['./_base_/tiny_cpu.py']
custom_imports = dict(imports=['gepo_xtuner'], allow_failed_imports=False)

train_cfg = dict(advantage=dict(_delete_=True, type='GRPOAdvantage', eps=1e-8))
