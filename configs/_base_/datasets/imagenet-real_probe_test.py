# ImageNet-ReaL (Beyer et al., 2020): the 50,000 ILSVRC-2012 val images with reassessed
# multi-label annotations. A top-1 prediction is correct if it is in the image's label set;
# images with an empty set (1.4k) are excluded (ReaLAccuracy reports how many).
# Expected layout: the ImageNet val images (either mmpretrain layout, file names
# ILSVRC2012_val_XXXXXXXX.JPEG) and real.json (github.com/google-research/reassessed-imagenet;
# a JSON list of 50,000 label lists in file-number order) at data/imagenet/real.json:
#   data/imagenet/val/n01440764/ILSVRC2012_val_00000293.JPEG ...
#   data/imagenet/real.json
_base_ = ['./imagenet-v2-mf_probe_test.py']
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=256, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs', algorithm_keys=['real_labels']),
]
test_dataloader = dict(
    dataset=dict(
        _delete_=True,
        type='ImageNetReaL',
        data_root='data/imagenet',
        split='val',
        real_file='real.json',
        pipeline=test_pipeline))
test_evaluator = dict(_delete_=True, type='ReaLAccuracy')
