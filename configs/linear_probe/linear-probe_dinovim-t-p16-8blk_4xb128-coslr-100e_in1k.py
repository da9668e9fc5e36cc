# Table 1 (lower half, "heavy-weight probing head"): DinoVim-T, paper 73.7. The heavy head is a
# LINEAR head on more blocks: 256 x 8 blocks = 2048 dims -> 2.0M parameters (the official
# release's n_last_blocks=8 for Tiny; see mmdinomamba/models/classifiers/linear_probe.py).
# The official README used weight decay 0 for Tiny; the paper's best (1e-3) is kept here.
# Weights: --cfg-options model.backbone.init_cfg.checkpoint=work_dirs/
#   dino_dinovim-t-p16_4xb48-100e_in1k/epoch_100.pth
# (converted official checkpoint: also set model.backbone.legacy_dinomamba_layout=True)
_base_ = ['./_base_/linear-probe_4xb128-sgd-coslr-100e_in1k.py']
model = dict(
    backbone=dict(type='DinoVim', arch='t', legacy_dinomamba_layout=False),
    num_blocks=8,
    feature_source='mixer',
    neck=dict(pooling='cls', avgpool=False))
