# GEPO ablation "w/o asymmetric advantage shaping" (section 3.2, Table 2):
# alpha_low = alpha_high. The paper gives no value; 0.2 keeps the high-entropy side as in
# GEPO and drops the "gentler nudge" of alpha_low 0.5 (section 2.3).
_base_ = ['./gepo.py']

advantage = dict(alpha_low=0.2)
