# Table 5 (middle), DinoVim-S: weight decay 5e-3 at lr 1e-3 (4 blocks). Paper: 76.4.
_base_ = ['./linear-probe_dinovim-s-p16-4blk_4xb128-lr1e-3-wd0-coslr-100e_in1k.py']
optim_wrapper = dict(optimizer=dict(weight_decay=5e-3))
