# CPU demo of the detection pipeline: Cascade Mask R-CNN + a tiny DinoVim (64 wide, 4 blocks)
# + SimpleFPN on the embedded shapes data (6 classes, boxes + polygon masks; 64 px images
# resized to 128 px). Same model / optimizer recipe as the DinoVim-B config, an iteration-based
# short schedule and a larger lr (backbone from scratch unless init_cfg points at a demo DINO
# checkpoint, see configs/det/README.md). Reports COCO bbox and segm AP on the embedded val split.
_base_ = './cascade-mask-rcnn_dinovim-b-simplefpn_8xb2-1x_coco.py'

data_root = 'data/embedded'
# 6 shape classes; pyramid and RoI heads 64 wide (instead of 256 / 1024) so that a CPU iteration
# takes seconds: CPU RoIAlign dominates, so 2x2 samples per bin, 128 sampled RoIs per image and
# stage (mmdet: 512) and at most 20 detections per image (~1.4 objects per image). The three
# cascade stages keep mmdet's IoU thresholds (0.5, 0.6, 0.7) and box-coder stds.
model = dict(
    backbone=dict(
        arch=dict(_delete_=True, embed_dims=64, num_layers=4),
        mixer_cfg=dict(d_state=16, headdim=16),
        img_size=128,
        drop_path_rate=0.,
        init_cfg=None),
    neck=dict(in_channels=64, out_channels=64),
    rpn_head=dict(in_channels=64, feat_channels=64),
    roi_head=dict(
        bbox_roi_extractor=dict(roi_layer=dict(sampling_ratio=2), out_channels=64),
        bbox_head=[
            dict(type='Shared2FCBBoxHead', in_channels=64, fc_out_channels=256, roi_feat_size=7,
                 num_classes=6, reg_class_agnostic=True,
                 bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0., 0., 0., 0.],
                                 target_stds=stds),
                 loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
                 loss_bbox=dict(type='SmoothL1Loss', beta=1.0, loss_weight=1.0))
            for stds in ([0.1, 0.1, 0.2, 0.2], [0.05, 0.05, 0.1, 0.1],
                         [0.033, 0.033, 0.067, 0.067])
        ],
        mask_roi_extractor=dict(roi_layer=dict(sampling_ratio=2), out_channels=64),
        mask_head=dict(in_channels=64, conv_out_channels=64, num_classes=6)),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=1000, max_per_img=500),
        rcnn=[
            dict(assigner=dict(type='MaxIoUAssigner', pos_iou_thr=iou, neg_iou_thr=iou,
                               min_pos_iou=iou, match_low_quality=False, ignore_iof_thr=-1),
                 sampler=dict(type='RandomSampler', num=128, pos_fraction=0.25, neg_pos_ub=-1,
                              add_gt_as_proposals=True),
                 mask_size=28, pos_weight=-1, debug=False) for iou in (0.5, 0.6, 0.7)
        ]),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=300), rcnn=dict(max_per_img=20)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(_delete_=True, type='EmbeddedShapesCoco', data_root=data_root, generate=False,
                 split='train',
                 filter_cfg=dict(filter_empty_gt=True, min_size=16), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(_delete_=True, type='EmbeddedShapesCoco', data_root=data_root, generate=False,
                 split='val',
                 test_mode=True, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + '/coco/annotations/instances_val.json')
test_evaluator = val_evaluator

optim_wrapper = dict(optimizer=dict(lr=2e-4))
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=300, val_interval=300)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=50),
    dict(type='MultiStepLR', by_epoch=False, begin=0, end=300, milestones=[200, 270], gamma=0.1)
]
default_hooks = dict(logger=dict(interval=20), checkpoint=dict(by_epoch=False, interval=300))
log_processor = dict(by_epoch=False)
