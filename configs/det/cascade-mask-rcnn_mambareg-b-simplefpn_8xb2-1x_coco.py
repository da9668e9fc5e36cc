# Cascade Mask R-CNN + MambaReg-B (DinoVim-B with 12 registers, dropped from the map).
_base_ = './cascade-mask-rcnn_vit-b-simplefpn_8xb2-1x_coco.py'
model = dict(
    backbone=dict(
        type='mmpretrain.MambaReg',
        init_cfg=dict(checkpoint='checkpoints/dino_mambareg-b_in1k.pth')))
