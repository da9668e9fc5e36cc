# UperNet + MambaReg-S on ADE20K: the MambaReg-B recipe at width 512.
_base_ = './upernet_mambareg-b_8xb2-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(arch='s', init_cfg=dict(checkpoint='checkpoints/dino_mambareg-s_in1k.pth')),
    neck=dict(in_channels=[512] * 4, out_channels=512),
    decode_head=dict(in_channels=[512] * 4),
    auxiliary_head=dict(in_channels=512))
