# CPU smoke run: a tiny MILA classifier on the embedded shapes data (64 px, 6 classes).
_base_ = 'mmpretrain::_base_/default_runtime.py'
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

data_root = 'data/embedded'
model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='MILA',
        arch=dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4]),
        img_size=64,
        drop_path_rate=0.1),
    head=dict(type='LinearClsHead', num_classes=6, in_channels=128,
              loss=dict(type='CrossEntropyLoss')))
data_preprocessor = dict(
    num_classes=6, mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=True)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
train_dataloader = dict(
    batch_size=16, num_workers=0, persistent_workers=False,
    dataset=dict(type='EmbeddedShapes', data_root=data_root, generate=False, split='train',
                 pipeline=train_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=True))
val_dataloader = dict(
    batch_size=16, num_workers=0, persistent_workers=False,
    dataset=dict(type='EmbeddedShapes', data_root=data_root, generate=False, split='val',
                 pipeline=test_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=False))
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_dataloader = val_dataloader
test_evaluator = val_evaluator

optim_wrapper = dict(optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05),
                     clip_grad=dict(max_norm=5.0))
param_scheduler = dict(type='CosineAnnealingLR', by_epoch=True, T_max=2)
train_cfg = dict(by_epoch=True, max_epochs=2, val_interval=1)
val_cfg = dict()
test_cfg = dict()
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(type='AtomicCheckpointHook', interval=1, max_keep_ckpts=1))
