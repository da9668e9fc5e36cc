# Cascade Mask R-CNN + LinearViT-B/16 (DINO-pretrained) on COCO 2017 (paper Table 3).
_base_ = './cascade-mask-rcnn_vit-b-simplefpn_8xb2-1x_coco.py'
model = dict(
    backbone=dict(
        type='mmpretrain.LinearViT',
        init_cfg=dict(checkpoint='checkpoints/dino_linearvit-b_in1k.pth')))
