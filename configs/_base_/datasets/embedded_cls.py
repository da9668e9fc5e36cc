# The embedded data set as a 6-class classification set: 64 px images, labels from
# meta/{train,val}.txt, top-1 accuracy. Leaf configs set batch sizes / pipelines. The data are
# written by tools/misc/make_embedded_data.py (or the demo); a missing folder is an error.
dataset_type = 'EmbeddedShapes'
data_root = 'data/embedded'
data_preprocessor = dict(
    num_classes=6, mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=True)
test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
train_dataloader = dict(
    batch_size=32,
    num_workers=0,
    persistent_workers=False,  # mmpretrain's tools/train.py defaults it to True
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root, generate=False, split='train',
                 pipeline=test_pipeline))
val_dataloader = dict(
    batch_size=64,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, generate=False, split='val',
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_evaluator = val_evaluator
