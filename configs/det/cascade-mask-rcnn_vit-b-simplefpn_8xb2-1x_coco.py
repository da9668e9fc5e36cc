# Cascade Mask R-CNN + ViT-B/16 (DINO-pretrained) on COCO 2017, the paper's detection setting
# (Appendix C): images resized to 1333x800 (keep ratio) for train / val / test, AdamW lr 1e-4,
# wd 0.1 with no decay on biases, position embeddings (and cls / register tokens, norms),
# LinearLR over 500 iters then MultiStepLR at epochs 8 and 11, 12 epochs (mmdet's 1x schedule).
# The plain backbone's last block (B, C, H/16, W/16) (position embedding interpolated to the
# padded, non-square input) feeds a ViTDet simple feature pyramid (strides 4..64, LN2d).
# 8 GPUs x 2 images as mmdet's 1x configs (the paper gives no batch size).
_base_ = 'mmdet::cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['mmdinomamba', 'mmdinomamba.downstream'],
                      allow_failed_imports=False)
default_scope = 'mmdet'

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmpretrain.ViT',
        arch='b',
        img_size=224,
        patch_size=16,
        out_indices=(-1, ),
        out_type='featmap',
        drop_path_rate=0.1,
        final_norm=True,
        # The DINO checkpoint's teacher backbone (see configs/det/README.md).
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/dino_vit-b_in1k.pth',
                      prefix='teacher.backbone.')),
    neck=dict(
        _delete_=True,
        type='SimpleFPN',
        in_channels=768,
        out_channels=256,
        scale_factors=(4.0, 2.0, 1.0, 0.5),
        num_outs=5,
        norm_cfg=dict(type='LN2d')))

# PlainLayerDecayOptimWrapperConstructor = the default constructor + optional layer-wise lr
# decay (paramwise_cfg.layer_decay_rate, 1.0 = off as in the paper; ViTDet uses 0.7).
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='PlainLayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    paramwise_cfg=dict(
        layer_decay_rate=1.0,
        bias_decay_mult=0.,
        norm_decay_mult=0.,
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.),
            'norm': dict(decay_mult=0.)  # backbone norms (RMSNorm is not found by
            # norm_decay_mult, which catches the LayerNorms of the backbone and the neck)
        }))
# kill-safe checkpoints (scratch file renamed into place, old ones removed after)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
