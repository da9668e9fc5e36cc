# DINO pretraining of ViT-B/16 (768 wide, 12 layers, ~85.8M) on ImageNet-1k: Table 1 row
# (linear probe 78.2 = the released DINO ViT-B/16, convertible with
# tools/model_converters/dino_vit2mmdm.py). This config retrains it with the shared recipe of
# the _base_ files (the paper's Mamba recipe is DINO's ViT-B one with clip 3.0, bf16 and
# min lr 1e-6) at 8 GPUs x 64 = 512 (lr 1e-3).
_base_ = [
    '../_base_/models/dino.py',
    '../_base_/datasets/dino_imagenet_2x224-8x96.py',
    '../_base_/schedules/dino_adamw-coslr-100e.py',
    '../_base_/dino_runtime.py',
]
model = dict(backbone=dict(type='ViT', arch='b'), head=dict(in_channels=768))
train_dataloader = dict(batch_size=64)
