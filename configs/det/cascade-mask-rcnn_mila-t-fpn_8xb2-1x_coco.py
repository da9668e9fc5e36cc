# Cascade Mask R-CNN + MILA-T (widths 64..512): the MILA-B config at tiny width (drop path 0.1
# as MLLA's Mask R-CNN MLLA-T config).
_base_ = './cascade-mask-rcnn_mila-b-fpn_8xb2-1x_coco.py'
model = dict(
    backbone=dict(arch='t', drop_path_rate=0.1,
                  init_cfg=dict(checkpoint='checkpoints/mila-t_in1k.pth')),
    neck=dict(in_channels=[64, 128, 256, 512]))
