# Table 5 (middle), DinoVim-S: weight decay 1e-3 at lr 1e-3 (4 blocks). Paper: 77.3.
_base_ = ['./linear-probe_dinovim-s-p16-4blk_4xb128-lr1e-3-wd0-coslr-100e_in1k.py']
optim_wrapper = dict(optimizer=dict(weight_decay=1e-3))
