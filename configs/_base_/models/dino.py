# DINO (Caron et al., ICCV 2021) as used by the paper (Section 4.2 / 5.1) for every backbone:
# 3-layer projection head (2048 hidden, 256 bottleneck, L2-normalized, weight-normed last layer
# to 65536 with unit-norm prototypes), student temperature 0.1, center momentum 0.9, teacher
# temperature 0.04 -> 0.07 over the first 30 epochs (paper text; the Dino-Mamba code ran a
# constant 0.04), teacher EMA momentum cosine 0.996 -> 1, last layer frozen for 1 epoch,
# stochastic depth 0.1 in the student (the teacher runs in eval mode, as in DINO).
# Leaf configs set the backbone type / arch and head.in_channels.
model = dict(
    type='DINO',
    backbone=dict(type='ViT', arch='s', img_size=224, patch_size=16, drop_path_rate=0.1),
    head=dict(
        type='DINOHead',
        in_channels=384,
        out_channels=65536,
        hidden_channels=2048,
        bottleneck_channels=256,
        num_layers=3,
        norm_last_layer=True),
    loss=dict(type='DINOLoss', student_temp=0.1, center_momentum=0.9),
    warmup_teacher_temp=0.04,
    teacher_temp=0.07,
    warmup_teacher_temp_epochs=30,
    momentum_teacher=0.996,
    final_momentum_teacher=1.0,
    freeze_last_layer=1,
    data_preprocessor=dict(
        type='DINODataPreprocessor',  # SelfSupDataPreprocessor without host waits
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        to_rgb=True))
