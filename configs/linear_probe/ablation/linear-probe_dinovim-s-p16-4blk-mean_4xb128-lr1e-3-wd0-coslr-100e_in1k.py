# Table 6, DinoVim-S: pooling 'mean' per block (see ProbeFeatureNeck; mean / max over the
# patch tokens), last 4 blocks, lr 1e-3, wd 0. Paper: 75.9 (middle cls alone: 77.2, the baseline).
_base_ = ['./linear-probe_dinovim-s-p16-4blk_4xb128-lr1e-3-wd0-coslr-100e_in1k.py']
model = dict(neck=dict(pooling='mean'))
