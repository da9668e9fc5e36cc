# The DINO demo recipe with a tiny LinearViT (linear attention; otherwise the tiny ViT of
# dino_vit-demo_1xb32-14e_embedded-64px.py).
#   python tools/demo.py --mixers dinovim vit linearvit
_base_ = ['./dino_vit-demo_1xb32-14e_embedded-64px.py']
model = dict(backbone=dict(type='LinearViT'))
