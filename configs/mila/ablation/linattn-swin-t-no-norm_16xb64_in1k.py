# Design (4) no attention normalization (28M, 4.5G, 72.4).
_base_ = './linattn-swin-t_16xb64_in1k.py'

model = dict(backbone=dict(mixer_cfg=dict(normalize=False)))
