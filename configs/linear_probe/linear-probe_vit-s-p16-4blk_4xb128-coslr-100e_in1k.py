# Table 1 (upper half): DINO ViT-S/16, paper 77.0 (= DINO's released ViT-S/16 linear result).
# DINO eval_linear protocol for ViT-S: cls token (after the final LayerNorm) of the last 4
# blocks, 4 x 384 = 1536 dims -> 1.5M head parameters.
# Weights: --cfg-options model.backbone.init_cfg.checkpoint=<DINO ckpt | converted ViT-S/16>
_base_ = ['./_base_/linear-probe_4xb128-sgd-coslr-100e_in1k.py']
model = dict(
    backbone=dict(type='ViT', arch='s'),
    num_blocks=4,
    feature_source='block',
    neck=dict(pooling='cls', avgpool=False))
