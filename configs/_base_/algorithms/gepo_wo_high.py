# GEPO ablation "w/o high entropy control" (section 3.2, Table 2): alpha_high = 1
# leaves negative advantages of high-entropy groups unscaled; everything else as in GEPO.
_base_ = ['./gepo.py']

advantage = dict(alpha_high=1.0)
