# Table 1 (lower half, heavy-weight head): DinoVim-S, paper 77.4 (= Table 5's best, lr 2e-3,
# wd 1e-3): 512 x 4 blocks = 2048 dims -> 2.0M-parameter linear head (official n_last_blocks=4).
# Weights: --cfg-options model.backbone.init_cfg.checkpoint=work_dirs/
#   dino_dinovim-s-p16_4xb48-100e_in1k/epoch_100.pth
# (converted official checkpoint: also set model.backbone.legacy_dinomamba_layout=True)
_base_ = ['./_base_/linear-probe_4xb128-sgd-coslr-100e_in1k.py']
model = dict(
    backbone=dict(type='DinoVim', arch='s', legacy_dinomamba_layout=False),
    num_blocks=4,
    feature_source='mixer',
    neck=dict(pooling='cls', avgpool=False))
