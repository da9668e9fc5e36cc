# Ablation baseline of "Demystify Mamba in Vision" (Table 1: 28M, 4.5G, 77.6): Swin-T geometry
# (4x4 patch stem, 2x2 linear merging, widths 96-768, depths 2-2-6-2, heads 3-6-12-24) with
# global ELU+1 linear attention in plain ViT blocks; no positional encoding, no Mamba design.
# Every other config in this folder switches one design on (or off) over this one.
_base_ = '../mila-t_16xb64_in1k.py'

model = dict(
    backbone=dict(
        arch=dict(_delete_=True, embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24]),
        drop_path_rate=0.2,
        stem='patch',
        downsample='linear',
        cpe=False,
        ape=False,
        mixer_cfg=dict(block_design='vit', rope=False, lepe=False)),
    head=dict(in_channels=768))
