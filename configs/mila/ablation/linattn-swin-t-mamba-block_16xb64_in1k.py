# Design (6) Mamba block design: in_proj -> dw conv -> SiLU -> attention (v = x),
# times a SiLU gate, -> out_proj (Table 1: 31M, 4.8G, 80.9).
_base_ = './linattn-swin-t_16xb64_in1k.py'

model = dict(backbone=dict(mixer_cfg=dict(block_design='mamba')))
