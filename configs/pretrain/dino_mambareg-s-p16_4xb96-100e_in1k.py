# DINO pretraining of Mamba-Reg-S/16 (512 wide, 24 layers, 12 registers) on ImageNet-1k.
# NOT in the paper (Table 1 has Mamba-Reg-B only); same recipe as dino_mambareg-b.
_base_ = [
    '../_base_/models/dino.py',
    '../_base_/datasets/dino_imagenet_2x224-8x96.py',
    '../_base_/schedules/dino_adamw-coslr-100e.py',
    '../_base_/dino_runtime.py',
]
model = dict(backbone=dict(type='MambaReg', arch='s'), head=dict(in_channels=512))
train_dataloader = dict(batch_size=96)
