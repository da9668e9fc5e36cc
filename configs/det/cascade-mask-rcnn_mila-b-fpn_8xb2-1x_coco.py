# Cascade Mask R-CNN + MILA-B (hierarchical, supervised ImageNet-1k) on COCO 2017. The four
# stages (strides 4..32, widths 96..768) feed mmdet's FPN (5 levels, as for a ResNet) instead of
# the simple feature pyramid of the plain backbones. Optimizer / schedule / data = the paper's
# recipe of the plain backbones (inherited; MLLA's own Mask R-CNN configs use wd 0.05).
_base_ = './cascade-mask-rcnn_vit-b-simplefpn_8xb2-1x_coco.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmpretrain.MILA',
        arch='b',
        out_indices=(0, 1, 2, 3),
        out_type='featmap',
        # scoped so that the block builds its mixer under the mmseg / mmdet default scope
        mixer_cfg=dict(type='mmpretrain.MambaLikeLinearAttention'),
        drop_path_rate=0.3,
        # an mmpretrain classifier checkpoint of configs/mila/mila-b_16xb64_in1k.py
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/mila-b_in1k.pth',
                      prefix='backbone.')),
    neck=dict(_delete_=True, type='FPN', in_channels=[96, 192, 384, 768], out_channels=256,
              num_outs=5))
