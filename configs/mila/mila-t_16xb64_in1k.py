# MILA-T (MLLA-T) ImageNet-1k, 300 epochs: 25M params, 4.2G MACs, 83.5 top-1 (paper).
# Swin recipe of mmpretrain (AdamW lr 1e-3 at batch 1024, wd 0.05, 20-epoch warmup, cosine;
# RandAugment m9-mstd0.5, random erasing 0.25, Mixup 0.8, CutMix 1.0, label smoothing 0.1,
# grad clip 5). The official code also uses MESA (not in mmpretrain; left out).
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(type='MILA', arch='t', img_size=224, drop_path_rate=0.2),
    neck=None,  # the backbone returns LN -> global average pool ('avg_featmap')
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=512,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        init_cfg=dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.),
        cal_acc=False),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]))

optim_wrapper = dict(clip_grad=dict(max_norm=5.0))
# kill-safe checkpoints (scratch file renamed into place, old ones removed after)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
