# UperNet + DinoVim-B (bidirectional Mamba-2, 24 blocks, DINO-pretrained) on ADE20K (Table 2).
# Same recipe as the ViT-B config; 4 evenly spaced blocks of 24.
_base_ = './upernet_vit-b_8xb2-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        type='mmpretrain.DinoVim',
        out_indices=(5, 11, 17, 23),
        init_cfg=dict(checkpoint='checkpoints/dino_dinovim-b_in1k.pth')))
