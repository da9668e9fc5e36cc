# Design (1) input gate: per-token, per-head Delta on the values (Table 1: 29M, 4.5G, 77.8).
_base_ = './linattn-swin-t_16xb64_in1k.py'

model = dict(backbone=dict(mixer_cfg=dict(input_gate=True)))
