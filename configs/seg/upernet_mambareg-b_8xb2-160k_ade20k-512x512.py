# UperNet + MambaReg-B (DinoVim-B with 12 register tokens; registers dropped from the maps).
_base_ = './upernet_dinovim-b_8xb2-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        type='mmpretrain.MambaReg',
        init_cfg=dict(checkpoint='checkpoints/dino_mambareg-b_in1k.pth')))
