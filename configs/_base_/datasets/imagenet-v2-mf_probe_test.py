# ImageNet-V2 matched-frequency (Recht et al., 2019), 10k images, for the Table 4 evaluation of a
# linear probe (tools/analysis/eval_robustness.py). Same preprocessing as the ImageNet val set.
# Expected layout (the official release, folders named by ImageNet-1k class INDEX 0..999):
#   data/imagenetv2-matched-frequency-format-val/0/<hash>.jpeg ... 999/<hash>.jpeg
data_preprocessor = dict(
    num_classes=1000, mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=True)
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=256, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]
test_dataloader = dict(
    batch_size=128,
    num_workers=8,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type='ImageNetVariant',
        data_root='data/imagenetv2-matched-frequency-format-val',
        folder_names='index',
        pipeline=test_pipeline))
test_evaluator = dict(type='Accuracy', topk=(1, 5))
