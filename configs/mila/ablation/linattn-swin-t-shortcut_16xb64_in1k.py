# Design (3) shortcut D * v (28M, 4.5G, 77.8).
_base_ = './linattn-swin-t_16xb64_in1k.py'

model = dict(backbone=dict(mixer_cfg=dict(shortcut=True)))
