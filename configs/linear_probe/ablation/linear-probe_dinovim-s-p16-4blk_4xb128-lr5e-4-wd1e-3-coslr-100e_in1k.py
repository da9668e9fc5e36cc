# Table 5 (right), DinoVim-S: lr 5e-4 at weight decay 1e-3 (4 blocks). Paper: 77.2.
# (lr 1e-3 with wd 1e-3 is the Table 5 middle config ...-lr1e-3-wd1e-3-...; lr 2e-3 / wd 1e-3 is
# also Table 1's heavy-head DinoVim-S row.)
_base_ = ['./linear-probe_dinovim-s-p16-4blk_4xb128-lr1e-3-wd0-coslr-100e_in1k.py']
optim_wrapper = dict(optimizer=dict(lr=5e-4, weight_decay=1e-3))
