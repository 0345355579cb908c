# GEPO on the built-in CPU setting (make demo), with the paper's hyperparameters: the
# defaults of GEPOAdvantage (gepo_xtuner/advantage/gepo.py), where they are written once.
# The entropy band belongs to the RL loop and is checkpointed with it.
_base_ = ['./_base_/tiny_cpu.py']
custom_imports = dict(imports=['gepo_xtuner'], allow_failed_imports=False)

train_cfg = dict(advantage=dict(_delete_=True, type='GEPOAdvantage'))
