# Table 1 (lower half, heavy-weight head): DinoMamba-Reg-B, paper 78.5 (the headline number):
# 768 x 8 blocks = 6144 dims -> 6.2M-parameter linear head. Per block the feature is the MEAN of
# the 12 register tokens of the final-normed mixer output (Dino-Mamba's eval_linear_mambar;
# pooling 'registers' would concatenate them instead, the input of Mamba-Reg's own head).
# Weights: --cfg-options model.backbone.init_cfg.checkpoint=<DINO MambaReg-B checkpoint>
# A converted official Mamba-Reg-B stores a 7x7 pos_embed: it is resized to 14x14 on load
# (exact at 224); model.backbone.img_size=112 reproduces the official resizing at every size.
_base_ = ['./_base_/linear-probe_4xb128-sgd-coslr-100e_in1k.py']
model = dict(
    backbone=dict(type='MambaReg', arch='b'),
    num_blocks=8,
    feature_source='mixer',
    neck=dict(pooling='cls', avgpool=False))
