# Table 1 (upper half): DINO ViT-B/16, paper 78.2 (= DINO's released ViT-B/16 linear result).
# DINO eval_linear protocol for ViT-B: cls token of the last block + the average of its patch
# tokens (--avgpool_patchtokens), 2 x 768 = 1536 dims -> 1.5M head parameters.
# Weights: --cfg-options model.backbone.init_cfg.checkpoint=<DINO ckpt | converted ViT-B/16>
_base_ = ['./_base_/linear-probe_4xb128-sgd-coslr-100e_in1k.py']
model = dict(
    backbone=dict(type='ViT', arch='b'),
    num_blocks=1,
    feature_source='block',
    neck=dict(pooling='cls', avgpool=True))
