# Design (2) forget gate: per-token decay exp(dt A), bidirectional SSD scan
# (Table 1: 29M, 4.8G, 78.4).
_base_ = './linattn-swin-t_16xb64_in1k.py'

model = dict(backbone=dict(mixer_cfg=dict(forget_gate=True, direction='bi')))
