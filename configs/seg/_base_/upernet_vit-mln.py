# UperNet for plain (single-scale) backbones, as in mmseg's ViT recipe: the backbone's 4 chosen
# blocks as feature maps -> MultiLevelNeck (x4, x2, x1, x0.5) -> UPerHead (512 channels) +
# an auxiliary FCNHead on the last level (loss weight 0.4). The values are mmseg's
# (`upernet_vit-b16_ln_mln`); the configs set the backbone (`_delete_=True`), the channels and
# the number of classes. Kept here so that the seg configs need no `mmseg::` base (mmengine
# looks those up under the distribution name `mmsegmentation`, see docs/design.md).
norm_cfg = dict(type='SyncBN', requires_grad=True)
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255)
model = dict(
    type='EncoderDecoder',
    data_preprocessor=data_preprocessor,
    pretrained=None,
    backbone=dict(),  # every config sets its own
    neck=dict(type='MultiLevelNeck', in_channels=[768] * 4, out_channels=768,
              scales=[4, 2, 1, 0.5]),
    decode_head=dict(
        type='UPerHead',
        in_channels=[768] * 4,
        in_index=[0, 1, 2, 3],
        pool_scales=(1, 2, 3, 6),
        channels=512,
        dropout_ratio=0.1,
        num_classes=19,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)),
    auxiliary_head=dict(
        type='FCNHead',
        in_channels=768,
        in_index=3,
        channels=256,
        num_convs=1,
        concat_input=False,
        dropout_ratio=0.1,
        num_classes=19,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=0.4)),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'))
