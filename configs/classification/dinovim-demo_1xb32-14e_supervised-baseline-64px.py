# The demo's supervised baseline (paper Figure 4(a): DINO vs supervised vs random init): the demo
# backbone (DinoVim 64 wide, 4 layers, patch 8) + a linear head, trained from scratch with
# cross-entropy on the labels of the same data, at the same image size (64 px) and batch (32) as
# the demo's DINO pretraining, for the same number of epochs (14 on the embedded data; the demo
# sets the epochs of its DINO run here too). A supervised step is one 64 px view instead of DINO's
# 2 global + 4 local crops and a teacher pass, so the budget is about a quarter of the DINO
# run's time. No validation during training: the demo evaluates the frozen backbone (k-NN, linear
# probe, Binary-AUC per layer) exactly as it evaluates the DINO teacher.
#   python tools/train.py configs/classification/dinovim-demo_1xb32-14e_supervised-baseline-64px.py
_base_ = ['./dinovim-demo_1xb32-5e_embedded-64px.py']
max_epochs = 14
img_size = 64
train_dataloader = dict(dataset=dict(pipeline=[
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(img_size, img_size)),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=20),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=max_epochs, eta_min=1e-5,
         convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=max_epochs + 1)
val_dataloader = None
val_cfg = None
val_evaluator = None
test_dataloader = None
test_cfg = None
test_evaluator = None
default_hooks = dict(checkpoint=dict(interval=1, max_keep_ckpts=1, save_last=True))
