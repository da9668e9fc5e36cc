# ImageNet-1k for linear probing, as DINO's eval_linear.py and Dino-Mamba's eval_linear_vim.py:
# train RandomResizedCrop 224 (scale 0.08-1, bilinear, PIL) + horizontal flip; val Resize 256
# (shorter side, bicubic) + CenterCrop 224; ImageNet mean / std. 128 images per GPU (x4 GPUs =
# the official 512).
# Expected layout (mmpretrain ImageNet; labels = sorted-wnid order):
#   data/imagenet/train/n01440764/n01440764_10026.JPEG ...   (1000 wnid folders)
#   data/imagenet/val/n01440764/ILSVRC2012_val_00000293.JPEG  (wnid folders), or a flat
#   data/imagenet/val/ILSVRC2012_val_00000001.JPEG + data/imagenet/meta/val.txt ("<file> <label>")
dataset_type = 'ImageNet'
data_root = 'data/imagenet'
data_preprocessor = dict(
    num_classes=1000, mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=True)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=224, backend='pillow'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=256, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=128,
    num_workers=10,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root, split='train', pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=128,
    num_workers=10,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, split='val', pipeline=test_pipeline))
val_evaluator = dict(type='Accuracy', topk=(1, 5))
test_dataloader = val_dataloader
test_evaluator = val_evaluator
