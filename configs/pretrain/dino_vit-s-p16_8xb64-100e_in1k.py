# DINO pretraining of ViT-S/16 (384 wide, 12 layers, ~21.7M) on ImageNet-1k: Table 1 row
# (linear probe 77.0 = the released DINO ViT-S/16, convertible with
# tools/model_converters/dino_vit2mmdm.py). This config retrains it with the shared recipe of
# the _base_ files at DINO's 100-epoch ViT-S/16 batch (8 GPUs x 64 = 512, lr 1e-3).
_base_ = [
    '../_base_/models/dino.py',
    '../_base_/datasets/dino_imagenet_2x224-8x96.py',
    '../_base_/schedules/dino_adamw-coslr-100e.py',
    '../_base_/dino_runtime.py',
]
model = dict(backbone=dict(type='ViT', arch='s'), head=dict(in_channels=384))
train_dataloader = dict(batch_size=64)
