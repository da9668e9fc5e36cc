# DINO pretraining of DinoVim-B/16 (768 wide, 24 layers, ~89M) on ImageNet-1k: Table 1 rows
# (linear probe 78.1 / 78.3). Paper Section 5.1 recipe (see the _base_ files). Batch as the
# Dino-Mamba code (4 GPUs x 48 = 192, lr 5e-4 * 192 / 256 = 3.75e-4 via auto_scale_lr).
_base_ = [
    '../_base_/models/dino.py',
    '../_base_/datasets/dino_imagenet_2x224-8x96.py',
    '../_base_/schedules/dino_adamw-coslr-100e.py',
    '../_base_/dino_runtime.py',
]
model = dict(backbone=dict(type='DinoVim', arch='b'), head=dict(in_channels=768))
train_dataloader = dict(batch_size=48)
