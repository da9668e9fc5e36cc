# Table 1 (upper half): DINO LinearViT-B/16 (psi = softmax linear attention), paper 74.7.
# Same protocol as ViT-B: last-block cls + averaged patch tokens, 1536 dims -> 1.5M head.
# Weights: --cfg-options model.backbone.init_cfg.checkpoint=work_dirs/
#   dino_linearvit-b-p16_4xb48-100e_in1k/epoch_100.pth
_base_ = ['./_base_/linear-probe_4xb128-sgd-coslr-100e_in1k.py']
model = dict(
    backbone=dict(type='LinearViT', arch='b'),
    num_blocks=1,
    feature_source='block',
    neck=dict(pooling='cls', avgpool=True))
