# Binary-AUC of DinoVim-B/16 (24 bidirectional Mamba-2 layers, middle cls) on ImageNet-S val.
# Map: the middle-cls row of the last layer's implicit attention (M_fwd + flip(M_bwd)) / 2 over
# the patches, one per SSD head: patches before the cls come from the forward scan, patches after
# it from the backward scan. For released Dino-Mamba weights add
# --cfg-options model.backbone.legacy_dinomamba_layout=True.
_base_ = './binary-auc_vit-b-p16_imagenet-s.py'

model = dict(backbone=dict(type='DinoVim', arch='b'))
