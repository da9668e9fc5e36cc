# CPU demo: Binary-AUC of a tiny DinoVim (64 wide, 4 layers, patch 8: 8x8 maps of the 64 px
# embedded images) on the embedded val split, every layer reported (Figure 4e style).
#   python tools/test.py configs/analysis/binary-auc_dinovim-demo_embedded.py --checkpoint CKPT
# Point CKPT at a demo DINO checkpoint with the same backbone settings.
_base_ = [
    'mmpretrain::_base_/default_runtime.py',
    '../_base_/datasets/embedded_fgmask.py',
]
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))  # kill-safe checkpoints

model = dict(
    type='FeatMapEvaluator',
    backbone=dict(
        type='DinoVim',
        arch=dict(embed_dims=64, num_layers=4),
        mixer_cfg=dict(d_state=16, headdim=16),
        img_size=64,
        patch_size=8),
    map_type='mixing',
    layers=None,
    head_reduce=None)
# A fixed seed makes the random-init baseline (no --checkpoint) the same model on every run.
randomness = dict(seed=0, deterministic=False)
