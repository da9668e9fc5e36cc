# The DINO demo recipe with a tiny ViT (64 wide, 4 layers, 4 heads, patch 8): the softmax-attention
# counterpart of dino_dinovim-demo_1xb32-14e_embedded-64px.py, same data, crops, schedule and hooks.
#   python tools/demo.py --mixers dinovim vit linearvit
_base_ = ['./dino_dinovim-demo_1xb32-14e_embedded-64px.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='ViT',
        arch=dict(embed_dims=64, num_layers=4, num_heads=4),
        img_size=64,
        patch_size=8))
