# Linear probing on ImageNet-1k with the paper's settings (Section 5.1, Appendix F, Table 5):
# frozen backbone in eval mode; feature = concatenated final-normed pooled tokens of the last n
# blocks (+ optional averaged patch tokens); linear head (no BatchNorm, weight N(0, 0.01), bias
# 0); SGD momentum 0.9, lr 2e-3, weight decay 1e-3 (best in Table 5), cosine to 0 over 100
# epochs, batch 4 x 128 = 512 (the official eval_linear: lr 1e-3 x 512 / 256 = 2e-3);
# RandomResizedCrop 224 + flip / Resize 256 bicubic + CenterCrop 224.
# Leaf configs set the backbone, num_blocks, feature_source and the neck.
#
# Backbone weights: init_cfg.checkpoint = a DINO checkpoint of this package (its EMA teacher is
# read under prefix 'teacher.backbone.'), or a backbone-only file (keys bare or under
# 'backbone.': tools/model_converters/extract_backbone.py, dinomamba2mmdm.py, dino_vit2mmdm.py),
# recognized whatever the prefix. Loading is strict. Override on the command line:
#   python tools/train.py CONFIG --cfg-options model.backbone.init_cfg.checkpoint=PATH
_base_ = [
    '../../_base_/datasets/imagenet_bs128_probe.py',
    'mmpretrain::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

model = dict(
    type='LinearProbe',
    backbone=dict(
        type='ViT',
        arch='s',
        img_size=224,
        patch_size=16,
        drop_path_rate=0.,
        init_cfg=dict(type='Pretrained', checkpoint=None, prefix='teacher.backbone.')),
    num_blocks=4,
    feature_source='block',
    neck=dict(type='ProbeFeatureNeck', pooling='cls', avgpool=False),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        loss=dict(type='CrossEntropyLoss'),
        topk=(1, 5),
        init_cfg=dict(type='Normal', layer='Linear', std=0.01, bias=0.)))

optim_wrapper = dict(optimizer=dict(type='SGD', lr=2e-3, momentum=0.9, weight_decay=1e-3))
param_scheduler = [
    dict(type='CosineAnnealingLR', T_max=100, by_epoch=True, begin=0, end=100, eta_min=0.)
]
train_cfg = dict(by_epoch=True, max_epochs=100, val_interval=10)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(base_batch_size=512)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook', interval=10, max_keep_ckpts=2))
randomness = dict(seed=0)
