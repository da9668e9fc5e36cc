# DINO pretraining of LinearViT-B/16 (ViT-B with psi(Q) psi(K)^T, psi = softmax; ~85.8M) on
# ImageNet-1k: Table 1 row (linear probe 74.7). Trained by the authors like the Mamba models:
# the paper's Section 5.1 recipe (see the _base_ files) at the DinoVim batch, 4 GPUs x 48.
_base_ = [
    '../_base_/models/dino.py',
    '../_base_/datasets/dino_imagenet_2x224-8x96.py',
    '../_base_/schedules/dino_adamw-coslr-100e.py',
    '../_base_/dino_runtime.py',
]
model = dict(backbone=dict(type='LinearViT', arch='b'), head=dict(in_channels=768))
train_dataloader = dict(batch_size=48)
