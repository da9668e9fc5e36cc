# DINO pretraining of DinoMamba-Reg-B/16 (768 wide, 24 layers, 12 registers, ~89M) on
# ImageNet-1k: Table 1 row (linear probe 78.5). Paper Section 5.1 recipe (see the _base_ files).
# Batch as the Dino-Mamba code (main_dino_mambar.py: 4 GPUs x 96 = 384, lr 7.5e-4 via
# auto_scale_lr).
_base_ = [
    '../_base_/models/dino.py',
    '../_base_/datasets/dino_imagenet_2x224-8x96.py',
    '../_base_/schedules/dino_adamw-coslr-100e.py',
    '../_base_/dino_runtime.py',
]
model = dict(backbone=dict(type='MambaReg', arch='b'), head=dict(in_channels=768))
train_dataloader = dict(batch_size=96)
