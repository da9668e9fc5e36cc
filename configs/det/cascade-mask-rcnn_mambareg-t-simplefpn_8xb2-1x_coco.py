# Cascade Mask R-CNN + MambaReg-T on COCO: the MambaReg-B recipe at width 256.
_base_ = './cascade-mask-rcnn_mambareg-b-simplefpn_8xb2-1x_coco.py'
model = dict(
    backbone=dict(arch='t', init_cfg=dict(checkpoint='checkpoints/dino_mambareg-t_in1k.pth')),
    neck=dict(in_channels=256))
