# Design (5) single head with Mamba-like query/key width d_state = 16 (24M, 3.9G, 73.5).
_base_ = './linattn-swin-t_16xb64_in1k.py'

model = dict(
    backbone=dict(arch=dict(num_heads=[1, 1, 1, 1]), mixer_cfg=dict(qk_dim=16)))
