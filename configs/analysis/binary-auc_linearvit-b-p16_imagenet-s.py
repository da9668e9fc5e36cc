# Binary-AUC of a DINO LinearViT-B/16 on ImageNet-S val: the last layer's CLS row of the
# row-normalized psi(Q) psi(K)^T (psi = softmax) over the patches, one map per head.
_base_ = './binary-auc_vit-b-p16_imagenet-s.py'

model = dict(backbone=dict(type='LinearViT', arch='b'))
