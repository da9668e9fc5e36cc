# UperNet + DinoVim-T on ADE20K: the DinoVim-B recipe at width 256.
_base_ = './upernet_dinovim-b_8xb2-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(arch='t', init_cfg=dict(checkpoint='checkpoints/dino_dinovim-t_in1k.pth')),
    neck=dict(in_channels=[256] * 4, out_channels=256),
    decode_head=dict(in_channels=[256] * 4),
    auxiliary_head=dict(in_channels=256))
