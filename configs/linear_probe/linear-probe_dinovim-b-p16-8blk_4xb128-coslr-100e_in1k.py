# Table 1 (lower half, heavy-weight head): DinoVim-B, paper 78.3: 768 x 8 blocks = 6144 dims ->
# 6.2M-parameter linear head (official n_last_blocks=8). The official README used weight decay
# 1e-2 for Base; the paper's best (1e-3) is kept here.
# Weights: --cfg-options model.backbone.init_cfg.checkpoint=work_dirs/
#   dino_dinovim-b-p16_4xb48-100e_in1k/epoch_100.pth
# (converted official checkpoint: also set model.backbone.legacy_dinomamba_layout=True)
_base_ = ['./_base_/linear-probe_4xb128-sgd-coslr-100e_in1k.py']
model = dict(
    backbone=dict(type='DinoVim', arch='b', legacy_dinomamba_layout=False),
    num_blocks=8,
    feature_source='mixer',
    neck=dict(pooling='cls', avgpool=False))
