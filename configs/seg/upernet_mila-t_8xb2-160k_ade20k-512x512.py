# UperNet + MILA-T (widths 64..512): the MILA-B config at tiny width.
_base_ = './upernet_mila-b_8xb2-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(arch='t', drop_path_rate=0.2,
                  init_cfg=dict(checkpoint='checkpoints/mila-t_in1k.pth')),
    decode_head=dict(in_channels=[64, 128, 256, 512]),
    auxiliary_head=dict(in_channels=256))
