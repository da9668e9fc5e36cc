# Table 5 (left), DinoVim-S: concatenate the last 3 block(s) (lr 1e-3, wd 0). Paper: 76.7.
_base_ = ['./linear-probe_dinovim-s-p16-4blk_4xb128-lr1e-3-wd0-coslr-100e_in1k.py']
model = dict(num_blocks=3)
