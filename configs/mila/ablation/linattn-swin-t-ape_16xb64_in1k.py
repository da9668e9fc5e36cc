# Positional encoding instead of the forget gate (Table 2): APE (30M, 4.5G, 80.0).
_base_ = './linattn-swin-t_16xb64_in1k.py'

model = dict(backbone=dict(ape=True))
