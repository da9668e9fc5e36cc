# Supervised baseline on the embedded data (CPU, about a minute on 2 cores): a tiny DinoVim
# (64 wide, 4 blocks, patch 8; the demo backbone) + linear head, trained from scratch on the six
# shape classes. It exercises tools/train.py / tools/test.py end to end (checkpoints, --resume,
# validation with mmpretrain's Accuracy) and is an upper reference for the demo's linear probes.
#   python tools/train.py configs/classification/dinovim-demo_1xb32-5e_embedded-64px.py
_base_ = ['mmpretrain::_base_/default_runtime.py']
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

data_root = 'data/embedded'
model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='DinoVim',
        arch=dict(embed_dims=64, num_layers=4),
        mixer_cfg=dict(d_state=16, headdim=16),
        img_size=64,
        patch_size=8,
        drop_path_rate=0.0),
    head=dict(
        type='LinearClsHead',
        num_classes=6,
        in_channels=64,
        loss=dict(type='CrossEntropyLoss'),
        topk=(1, )))
data_preprocessor = dict(
    num_classes=6, mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=True)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
train_dataloader = dict(
    batch_size=32,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type='EmbeddedShapes', data_root=data_root, split='train',
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=64,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='EmbeddedShapes', data_root=data_root, split='val',
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_evaluator = val_evaluator

optim_wrapper = dict(optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05),
                     clip_grad=dict(max_norm=3.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=1, eta_min=1e-5),
]
train_cfg = dict(by_epoch=True, max_epochs=5, val_interval=1)
val_cfg = dict()
test_cfg = dict()
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=2))
# EpochSeedHook re-seeds every epoch so that `--resume` repeats the uninterrupted run exactly.
custom_hooks = [dict(type='EpochSeedHook')]
randomness = dict(seed=0, deterministic=False)
