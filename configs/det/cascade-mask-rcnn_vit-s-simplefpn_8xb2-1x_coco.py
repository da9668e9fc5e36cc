# Cascade Mask R-CNN + ViT-S/16 on COCO: the ViT-B recipe at width 384.
_base_ = './cascade-mask-rcnn_vit-b-simplefpn_8xb2-1x_coco.py'
model = dict(
    backbone=dict(arch='s', init_cfg=dict(checkpoint='checkpoints/dino_vit-s_in1k.pth')),
    neck=dict(in_channels=384))
