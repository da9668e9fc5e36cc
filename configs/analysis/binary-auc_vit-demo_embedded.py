# CPU demo: Binary-AUC of a tiny ViT (64 wide, 4 layers, 4 heads, patch 8) on the embedded val
# split: the softmax-attention counterpart of binary-auc_dinovim-demo_embedded.py.
#   python tools/test.py configs/analysis/binary-auc_vit-demo_embedded.py [--checkpoint CKPT]
_base_ = ['./binary-auc_dinovim-demo_embedded.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='ViT',
        arch=dict(embed_dims=64, num_layers=4, num_heads=4),
        img_size=64,
        patch_size=8))
