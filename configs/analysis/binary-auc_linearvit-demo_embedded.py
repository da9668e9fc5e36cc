# CPU demo: Binary-AUC of a tiny LinearViT (the linear-attention counterpart of the tiny ViT).
#   python tools/test.py configs/analysis/binary-auc_linearvit-demo_embedded.py [--checkpoint CKPT]
_base_ = ['./binary-auc_vit-demo_embedded.py']
model = dict(backbone=dict(type='LinearViT'))
