# Supervised baseline on the embedded data (CPU, about a minute on 2 cores): a tiny DinoVim
# (64 wide, 4 blocks, patch 8; the demo backbone) + linear head, trained from scratch on the six
# shape classes. It exercises tools/train.py / tools/test.py end to end (checkpoints, --resume,
# validation with mmpretrain's Accuracy) and is an upper reference for the demo's linear probes.
#   python tools/train.py configs/classification/dinovim-demo_1xb32-5e_embedded-64px.py
_base_ = ['mmpretrain::_base_/default_runtime.py', '../_base_/datasets/embedded_cls.py']
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

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
train_dataloader = dict(dataset=dict(pipeline=[
    dict(type='LoadImageFromFile'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]))

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
    checkpoint=dict(type='AtomicCheckpointHook', interval=1, max_keep_ckpts=2))
# EpochSeedHook re-seeds every epoch so that `--resume` repeats the uninterrupted run exactly.
custom_hooks = [dict(type='EpochSeedHook')]
randomness = dict(seed=0, deterministic=False)
