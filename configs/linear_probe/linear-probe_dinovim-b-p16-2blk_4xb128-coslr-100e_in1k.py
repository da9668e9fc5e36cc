# Table 1 (upper half): DinoVim-B, paper 78.1 with a 1.5M-parameter head: 768 x 2 blocks = 1536
# dims. Dino-Mamba protocol: final RMSNorm of each block's mixer output at the middle cls token.
# Weights: --cfg-options model.backbone.init_cfg.checkpoint=work_dirs/
#   dino_dinovim-b-p16_4xb48-100e_in1k/epoch_100.pth
# (converted official checkpoint: also set model.backbone.legacy_dinomamba_layout=True)
_base_ = ['./_base_/linear-probe_4xb128-sgd-coslr-100e_in1k.py']
model = dict(
    backbone=dict(type='DinoVim', arch='b', legacy_dinomamba_layout=False),
    num_blocks=2,
    feature_source='mixer',
    neck=dict(pooling='cls', avgpool=False))
