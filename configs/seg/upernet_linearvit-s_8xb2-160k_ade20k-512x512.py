# UperNet + LinearViT-S/16 on ADE20K: the LinearViT-B recipe at width 384.
_base_ = './upernet_linearvit-b_8xb2-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(arch='s', init_cfg=dict(checkpoint='checkpoints/dino_linearvit-s_in1k.pth')),
    neck=dict(in_channels=[384] * 4, out_channels=384),
    decode_head=dict(in_channels=[384] * 4),
    auxiliary_head=dict(in_channels=384))
