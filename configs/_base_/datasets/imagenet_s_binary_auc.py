# ImageNet-S validation (12,419 images, 919 classes) with binary foreground masks for Binary-AUC.
# Layout: data/imagenet-s/ImageNetS919/{validation,validation-segmentation}/<wnid>/<name>.{JPEG,png}
# Images (and masks, nearest) are resized to 224x224 without cropping, so the whole mask counts;
# BinaryAUC then area-resizes the mask to the patch grid (14x14 for patch 16).
dataset_type = 'ImageNetS'
data_root = 'data/imagenet-s'
img_size = 224
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadFgMask', mask_format='imagenet_s'),
    dict(type='Resize', scale=(img_size, img_size)),
    dict(type='PackInputs', algorithm_keys=['gt_seg_map']),
]
test_dataloader = dict(
    batch_size=32,
    num_workers=4,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, subset='ImageNetS919',
                 split='validation', pipeline=test_pipeline))
test_evaluator = dict(type='BinaryAUC')  # exact AUC; num_thresholds=101 for the paper's sweep
test_cfg = dict()
