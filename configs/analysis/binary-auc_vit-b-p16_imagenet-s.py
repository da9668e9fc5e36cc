# Binary-AUC (paper Sec. 4.1) of a DINO ViT-B/16 on ImageNet-S val (12,419 images):
#   python tools/test.py configs/analysis/binary-auc_vit-b-p16_imagenet-s.py --checkpoint CKPT
# CKPT: a DINO checkpoint (the teacher backbone is used), a converted official DINO ViT, or an
# extracted backbone. Maps: the last layer's CLS row of the attention matrix over the patches,
# one per head, min-max normalized per image; reported: mean raw and normalized
# (max(AUC, 1 - AUC)) AUC in % over images and heads, plus per head.
# Variants: --cfg-options model.map_type=cosine (CLS-patch cosine similarity),
# model.head_reduce=mean (one head-averaged map), "model.layers=[0,1,2,3,4,5,6,7,8,9,10,11]"
# (per-layer curve, Figure 4e), test_evaluator.num_thresholds=101 (the paper's fixed sweep).
_base_ = [
    'mmpretrain::_base_/default_runtime.py',
    '../_base_/datasets/imagenet_s_binary_auc.py',
]
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))  # kill-safe checkpoints

model = dict(
    type='FeatMapEvaluator',
    backbone=dict(type='ViT', arch='b', img_size=224, patch_size=16),
    map_type='mixing',
    layers=[-1],
    head_reduce=None)
