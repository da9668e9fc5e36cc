# DINO pretraining of DinoVim-T/16 (256 wide, 24 layers, ~10.7M) on ImageNet-1k: Table 1 row
# (linear probe 73.7). Paper Section 5.1 recipe (see the _base_ files). Batch as the Dino-Mamba
# code (4 GPUs x 48 = 192, lr 5e-4 * 192 / 256 = 3.75e-4 via auto_scale_lr); the paper text
# quotes 16 GPUs x 64 = 1024 for its Mamba-S run. Data: data/imagenet (train/ folder layout).
_base_ = [
    '../_base_/models/dino.py',
    '../_base_/datasets/dino_imagenet_2x224-8x96.py',
    '../_base_/schedules/dino_adamw-coslr-100e.py',
    '../_base_/dino_runtime.py',
]
model = dict(backbone=dict(type='DinoVim', arch='t'), head=dict(in_channels=256))
train_dataloader = dict(batch_size=48)
