# Appendix F ablation baseline (DinoVim-S): last 4 blocks, middle cls, lr 1e-3, wd 0.
# Paper: 77.2 = Table 5 left (4 blocks) = Table 5 middle (wd 0) = Table 6 (middle cls).
# The Table 5 / 6 configs in this folder are deltas over this file.
# Weights: --cfg-options model.backbone.init_cfg.checkpoint=work_dirs/
#   dino_dinovim-s-p16_4xb48-100e_in1k/epoch_100.pth
_base_ = ['../linear-probe_dinovim-s-p16-4blk_4xb128-coslr-100e_in1k.py']
optim_wrapper = dict(optimizer=dict(lr=1e-3, weight_decay=0.))
