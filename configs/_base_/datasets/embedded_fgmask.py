# The embedded data set with binary foreground masks, for Binary-AUC on CPU. Images are 64x64;
# with patch size 8 the maps are 8x8. The data are written by tools/misc/make_embedded_data.py
# (or the demo); a missing folder is an error.
dataset_type = 'EmbeddedShapes'
data_root = 'data/embedded'
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadFgMask', mask_format='binary'),
    dict(type='PackInputs', algorithm_keys=['gt_seg_map']),
]
test_dataloader = dict(
    batch_size=32,
    num_workers=0,
    persistent_workers=False,  # mmpretrain's tools/test.py defaults it to True
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, generate=False, split='val',
                 with_mask=True,
                 pipeline=test_pipeline))
test_evaluator = dict(type='BinaryAUC')
test_cfg = dict()
