# ImageNet-1k train split for DINO: 2 global crops 224 px (area 0.4-1) + 8 local crops 96 px
# (area 0.05-0.4) with DINO's augmentations (DINOMultiCrop). Folder layout under data/imagenet:
# train/<wnid>/*.JPEG (meta/train.txt is used when present).
# Workers are not persistent: mmengine re-seeds them every epoch, so --resume is exact.
data_root = 'data/imagenet'
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(
        type='DINOMultiCrop',
        global_crop_size=224,
        local_crop_size=96,
        global_crops_scale=(0.4, 1.),
        local_crops_scale=(0.05, 0.4),
        num_local_crops=8),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=48,
    num_workers=10,
    persistent_workers=False,
    pin_memory=True,
    drop_last=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),
    dataset=dict(type='ImageNet', data_root=data_root, split='train', pipeline=train_pipeline))
