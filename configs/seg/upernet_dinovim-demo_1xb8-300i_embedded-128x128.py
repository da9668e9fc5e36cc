# CPU demo of the segmentation pipeline: UperNet + a tiny DinoVim (64 wide, 4 blocks) on the
# embedded shapes data (7 classes: background + 6 shapes; 64 px images upsampled to 128 px, an
# 8x8 patch grid). Same model / optimizer recipe as the DinoVim-B config, shortened schedule and
# a larger lr (the backbone starts from scratch unless init_cfg points at a demo DINO checkpoint,
# see configs/seg/README.md). Reports mmseg's mIoU on the embedded val split.
_base_ = './upernet_dinovim-b_8xb2-160k_ade20k-512x512.py'

data_root = 'data/embedded'
crop_size = (128, 128)
norm_cfg = dict(type='BN', requires_grad=True)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        arch=dict(_delete_=True, embed_dims=64, num_layers=4),
        mixer_cfg=dict(d_state=16, headdim=16),
        img_size=128,
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.,
        init_cfg=None),
    neck=dict(in_channels=[64] * 4, out_channels=64),
    decode_head=dict(in_channels=[64] * 4, channels=64, num_classes=7, norm_cfg=norm_cfg),
    auxiliary_head=dict(in_channels=64, channels=32, num_classes=7, norm_cfg=norm_cfg))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='RandomResize', scale=crop_size, ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=crop_size, keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs')
]
train_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False,
    dataset=dict(_delete_=True, type='EmbeddedShapesSeg', data_root=data_root, generate=False,
                 split='train',
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False,
    dataset=dict(_delete_=True, type='EmbeddedShapesSeg', data_root=data_root, generate=False,
                 split='val',
                 pipeline=test_pipeline))
test_dataloader = val_dataloader

optim_wrapper = dict(optimizer=dict(lr=5e-4))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=30),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=30, end=300)
]
train_cfg = dict(max_iters=300, val_interval=300)
default_hooks = dict(logger=dict(interval=20), checkpoint=dict(interval=300))
