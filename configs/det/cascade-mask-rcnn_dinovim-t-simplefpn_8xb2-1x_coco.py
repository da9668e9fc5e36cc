# Cascade Mask R-CNN + DinoVim-T on COCO: the DinoVim-B recipe at width 256.
_base_ = './cascade-mask-rcnn_dinovim-b-simplefpn_8xb2-1x_coco.py'
model = dict(
    backbone=dict(arch='t', init_cfg=dict(checkpoint='checkpoints/dino_dinovim-t_in1k.pth')),
    neck=dict(in_channels=256))
