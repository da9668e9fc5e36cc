# UperNet + LinearViT-B/16 (ViT with linear attention, DINO-pretrained) on ADE20K (paper Table 2).
_base_ = './upernet_vit-b_8xb2-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        type='mmpretrain.LinearViT',
        init_cfg=dict(checkpoint='checkpoints/dino_linearvit-b_in1k.pth')))
