# GEPO ablation "w/o low entropy control" (section 3.2, Table 2): alpha_low = 1
# leaves positive advantages of low-entropy groups unscaled; everything else as in GEPO.
_base_ = ['./gepo.py']

advantage = dict(alpha_low=1.0)
