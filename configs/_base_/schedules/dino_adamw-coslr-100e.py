# DINO / Dino-Mamba optimization (paper Section 5.1): AdamW, lr = 5e-4 * total_batch / 256
# (auto_scale_lr does the scaling from the real batch: GPUs x batch_size), linear warm-up from 0
# over 10 epochs then cosine to 1e-6, weight decay cosine 0.04 -> 0.4 (no decay on biases and
# 1-D parameters), gradient clipping 3.0 per parameter (as DINO's clip_gradients), bf16 mixed
# precision, 100 epochs; all per iteration.
optim_wrapper = dict(
    type='DINOAmpOptimWrapper',
    dtype='bfloat16',
    constructor='DINOOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=5e-4, betas=(0.9, 0.999), weight_decay=0.04),
    paramwise_cfg=dict(flat_decay_mult=0.),
    clip_grad=dict(max_norm=3.0, per_param=True))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-9, by_epoch=True, begin=0, end=10,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=10, end=100,
         convert_to_iter_based=True),
    # eta_min_ratio keeps the no-decay groups at 0 (their base value)
    dict(type='CosineAnnealingParamScheduler', param_name='weight_decay', eta_min_ratio=10.,
         by_epoch=True, begin=0, end=100, convert_to_iter_based=True),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=100)
auto_scale_lr = dict(base_batch_size=256, enable=True)
