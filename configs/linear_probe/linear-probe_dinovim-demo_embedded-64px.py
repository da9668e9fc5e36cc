# Linear probe of the demo DINO backbone on the embedded labels (6 shape classes, 64 px; CPU:
# 81 s with OMP_NUM_THREADS=1 on a busy 2-core machine, where 2 threads were slower). The
# backbone is the demo DinoVim (64 wide, 4 blocks, patch 8), frozen and in eval mode; feature =
# the middle-cls token of the last 4 blocks, the final norm applied to each block's mixer output
# (the paper's DinoVim protocol, 4 x 64 = 256 dims); a linear head (N(0, 0.01), bias 0) trained
# with SGD + cosine for 10 epochs.
#
# Backbone weights: pass the checkpoint on the command line (it is None below = random init):
#   OMP_NUM_THREADS=1 python tools/train.py \
#       configs/linear_probe/linear-probe_dinovim-demo_embedded-64px.py \
#       --cfg-options model.backbone.init_cfg.checkpoint=work_dirs/<dino-demo>/epoch_3.pth
# A DINO checkpoint is read under prefix 'teacher.backbone.' (DINO evaluates the teacher); a
# backbone-only file (tools/model_converters/extract_backbone.py) is recognized whatever the
# prefix. Random-init baseline: leave checkpoint=None (or --cfg-options
# model.backbone.init_cfg=None); the log then says "RANDOMLY INITIALIZED backbone".
#
# Speed (the frozen tiny DinoVim runs at ~10 ms / image on one CPU core): no augmentation (the
# paper's RandomResizedCrop + flip is left out of this demo) and feature_cache=True, which
# memoizes the feature of every distinct input (exact: the backbone is frozen and
# deterministic), so the backbone sees each of the 2400 + 480 images once and epochs 2-10 only
# train the head. Validation: mmpretrain Accuracy (top-1) on the 'val' split.
_base_ = ['mmpretrain::_base_/default_runtime.py', '../_base_/datasets/embedded_cls.py']
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

model = dict(
    type='LinearProbe',
    backbone=dict(
        type='DinoVim',
        arch=dict(embed_dims=64, num_layers=4),
        mixer_cfg=dict(d_state=16, headdim=16),
        img_size=64,
        patch_size=8,
        init_cfg=dict(type='Pretrained', checkpoint=None, prefix='teacher.backbone.')),
    num_blocks=4,
    feature_source='mixer',
    neck=dict(type='ProbeFeatureNeck', pooling='cls', avgpool=False),
    feature_cache=True,
    head=dict(
        type='LinearClsHead',
        num_classes=6,
        loss=dict(type='CrossEntropyLoss'),
        topk=(1, ),
        init_cfg=dict(type='Normal', layer='Linear', std=0.01, bias=0.)))

# No augmentation (see above); the base's loaders, larger batches.
train_dataloader = dict(batch_size=128)
val_dataloader = dict(batch_size=240)
test_dataloader = val_dataloader

# The paper's probe optimizer (SGD, momentum 0.9, cosine to 0), lr raised for 10 short epochs.
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.02, momentum=0.9, weight_decay=0.))
param_scheduler = [dict(type='CosineAnnealingLR', by_epoch=True, begin=0, eta_min=0.)]
train_cfg = dict(by_epoch=True, max_epochs=10, val_interval=5)
val_cfg = dict()
test_cfg = dict()
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10),
    checkpoint=dict(type='AtomicCheckpointHook', interval=10, max_keep_ckpts=1))
custom_hooks = [dict(type='EpochSeedHook')]
randomness = dict(seed=0, deterministic=False)
