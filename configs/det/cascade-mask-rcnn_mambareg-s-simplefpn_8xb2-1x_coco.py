# Cascade Mask R-CNN + MambaReg-S on COCO: the MambaReg-B recipe at width 512.
_base_ = './cascade-mask-rcnn_mambareg-b-simplefpn_8xb2-1x_coco.py'
model = dict(
    backbone=dict(arch='s', init_cfg=dict(checkpoint='checkpoints/dino_mambareg-s_in1k.pth')),
    neck=dict(in_channels=512))
