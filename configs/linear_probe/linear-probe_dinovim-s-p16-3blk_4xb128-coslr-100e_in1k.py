# Table 1 (upper half): DinoVim-S, paper 76.7 with a 1.5M-parameter head: 512 x 3 blocks = 1536
# dims (Table 5 lists 76.7 for 3 blocks). Dino-Mamba protocol (eval_linear_vim): the final
# RMSNorm applied to each block's MIXER output at the middle cls token.
# Weights: --cfg-options model.backbone.init_cfg.checkpoint=work_dirs/
#   dino_dinovim-s-p16_4xb48-100e_in1k/epoch_100.pth
# A converted official checkpoint (tools/model_converters/dinomamba2mmdm.py) reproduces the
# released model with model.backbone.legacy_dinomamba_layout=True.
_base_ = ['./_base_/linear-probe_4xb128-sgd-coslr-100e_in1k.py']
model = dict(
    backbone=dict(type='DinoVim', arch='s', legacy_dinomamba_layout=False),
    num_blocks=3,
    feature_source='mixer',
    neck=dict(pooling='cls', avgpool=False))
