# UperNet + MILA-B (hierarchical Mamba-Inspired Linear Attention, supervised ImageNet-1k) on
# ADE20K. MILA's four stages (strides 4, 8, 16, 32; widths 96..768) feed UPerHead directly, so
# there is no neck (as MLLA's Swin-style UperNet); the auxiliary FCN head reads stage 3 (384).
# Optimizer / schedule / data = the paper's recipe of the plain backbones (inherited), so rows are
# comparable; MLLA's own UperNet config uses weight decay 0.01 instead of 0.05.
_base_ = './upernet_vit-b_8xb2-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmpretrain.MILA',
        arch='b',
        img_size=512,
        out_indices=(0, 1, 2, 3),
        out_type='featmap',
        # scoped so that the block builds its mixer under the mmseg / mmdet default scope
        mixer_cfg=dict(type='mmpretrain.MambaLikeLinearAttention'),
        drop_path_rate=0.3,  # mmseg's Swin-B UperNet value (MLLA's is not recorded here)
        # an mmpretrain classifier checkpoint of configs/mila/mila-b_16xb64_in1k.py
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/mila-b_in1k.pth',
                      prefix='backbone.')),
    neck=None,
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384, in_index=2))
