# Cascade Mask R-CNN + DinoVim-B (bidirectional Mamba-2, 24 blocks) on COCO 2017 (Table 3).
_base_ = './cascade-mask-rcnn_vit-b-simplefpn_8xb2-1x_coco.py'
model = dict(
    backbone=dict(
        type='mmpretrain.DinoVim',
        init_cfg=dict(checkpoint='checkpoints/dino_dinovim-b_in1k.pth')))
