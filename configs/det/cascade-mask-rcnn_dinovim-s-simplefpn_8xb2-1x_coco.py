# Cascade Mask R-CNN + DinoVim-S on COCO: the DinoVim-B recipe at width 512.
_base_ = './cascade-mask-rcnn_dinovim-b-simplefpn_8xb2-1x_coco.py'
model = dict(
    backbone=dict(arch='s', init_cfg=dict(checkpoint='checkpoints/dino_dinovim-s_in1k.pth')),
    neck=dict(in_channels=512))
