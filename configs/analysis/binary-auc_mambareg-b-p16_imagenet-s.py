# Binary-AUC of DinoMamba-Reg-B/16 on ImageNet-S val: one map per register token (12 registers
# spread among the patches act as "CLS", Figure 7) and SSD head; the metric also reports the AUC
# per register position (Figure 4d).
_base_ = './binary-auc_vit-b-p16_imagenet-s.py'

model = dict(backbone=dict(type='MambaReg', arch='b', num_registers=12))
