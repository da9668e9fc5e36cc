# UperNet + ViT-B/16 (DINO-pretrained) on ADE20K, the paper's segmentation setting (Appendix C):
# AdamW lr 6e-5, betas (0.9, 0.999), wd 0.05; LinearLR from 1e-6 over 1500 iters, then PolyLR to
# 160k iters. Model = mmseg's ViT + MultiLevelNeck recipe with our backbone: 4 evenly spaced
# blocks as (B, C, 32, 32) patch-token maps -> MultiLevelNeck (x4, x2, x1, x0.5) -> UPerHead +
# auxiliary FCNHead. 8 GPUs x 2 images, as mmseg's ViT configs (the paper gives no batch size).
# The bases hold mmseg's settings for this recipe (model, ADE20K, runtime + 160k schedule).
_base_ = [
    './_base_/upernet_vit-mln.py', './_base_/ade20k_512x512.py', './_base_/seg_runtime_160k.py'
]
custom_imports = dict(imports=['mmdinomamba', 'mmdinomamba.downstream'],
                      allow_failed_imports=False)
default_scope = 'mmseg'

crop_size = (512, 512)
model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='mmpretrain.ViT',
        arch='b',
        img_size=512,
        patch_size=16,
        out_indices=(2, 5, 8, 11),
        out_type='featmap',
        drop_path_rate=0.1,
        final_norm=True,
        # The DINO checkpoint's teacher backbone (see configs/seg/README.md). For a checkpoint
        # made by tools/model_converters/extract_backbone.py use its prefix instead; for
        # training from scratch pass --cfg-options model.backbone.init_cfg=None.
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/dino_vit-b_in1k.pth',
                      prefix='teacher.backbone.')),
    neck=dict(in_channels=[768] * 4, out_channels=768, scales=[4, 2, 1, 0.5]),
    decode_head=dict(in_channels=[768] * 4, num_classes=150),
    auxiliary_head=dict(in_channels=768, num_classes=150))

# No weight decay on position embedding, cls / register tokens and norms (mmseg's ViT recipe).
# PlainLayerDecayOptimWrapperConstructor = the default constructor + optional layer-wise lr
# decay (paramwise_cfg.layer_decay_rate, 1.0 = off as in the paper).
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='PlainLayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        layer_decay_rate=1.0,
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.),
            'norm': dict(decay_mult=0.)
        }))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=1500, end=160000)
]

train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
# kill-safe checkpoints (scratch file renamed into place, old ones removed after)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
