"""Every DINO pretraining config loads, states the paper's settings, and builds (tiny sizes)."""
import glob
import os.path as osp
import re

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmpretrain.registry import MODELS

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs/pretrain/*.py')))
PAPER = [c for c in CONFIGS if c.endswith('_in1k.py')]
DEMO = [c for c in CONFIGS if osp.basename(c).startswith('dino_dinovim-demo_')]
MIXER_DEMOS = [c for c in CONFIGS if 'demo' in osp.basename(c)]  # not in the checkout's path
DEMO_BACKBONE = dict(type='DinoVim', arch=dict(embed_dims=64, num_layers=4),
                     mixer_cfg=dict(d_state=16, headdim=16), img_size=64, patch_size=8)
NAME = re.compile(r'dino_(dinovim|mambareg|vit|linearvit)-([tsb])-p16_(\d+)xb(\d+)-100e_in1k')
TYPES = dict(dinovim='DinoVim', mambareg='MambaReg', vit='ViT', linearvit='LinearViT')


def test_table1_rows_have_configs():
    names = {osp.basename(c) for c in PAPER}
    for row in ('dinovim-t', 'dinovim-s', 'dinovim-b', 'mambareg-b', 'vit-s', 'vit-b',
                'linearvit-b'):
        assert any(n.startswith(f'dino_{row}-p16_') for n in names), row
    assert len(DEMO) == 1  # the one `make demo` runs
    assert sorted(osp.basename(c).split('-demo')[0] for c in MIXER_DEMOS) == [
        'dino_dinovim', 'dino_linearvit', 'dino_vit']  # tools/demo.py --mixers


def _multicrop(cfg):
    return next(t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'DINOMultiCrop')


@pytest.mark.parametrize('path', PAPER, ids=osp.basename)
def test_paper_settings(path):
    cfg = Config.fromfile(path)
    family, arch, gpus, batch = NAME.match(osp.basename(path)).groups()
    m = cfg.model
    assert (m.backbone.type, m.backbone.arch, m.backbone.patch_size) == (TYPES[family], arch, 16)
    assert m.backbone.drop_path_rate == 0.1 and m.backbone.img_size == 224
    assert cfg.train_dataloader.batch_size == int(batch) and int(gpus) in (4, 8)
    assert (m.head.out_channels, m.head.hidden_channels, m.head.bottleneck_channels,
            m.head.num_layers, m.head.norm_last_layer) == (65536, 2048, 256, 3, True)
    temps = (m.warmup_teacher_temp, m.teacher_temp, m.warmup_teacher_temp_epochs)
    assert temps == (0.04, 0.07, 30)
    assert (m.loss.student_temp, m.loss.center_momentum) == (0.1, 0.9)
    assert (m.momentum_teacher, m.final_momentum_teacher, m.freeze_last_layer) == (0.996, 1., 1)
    crop = _multicrop(cfg)
    assert (crop.global_crop_size, crop.local_crop_size, crop.num_local_crops) == (224, 96, 8)
    assert (crop.global_crops_scale, crop.local_crops_scale) == ((0.4, 1.), (0.05, 0.4))
    ds = cfg.train_dataloader.dataset
    assert (ds.type, ds.data_root, ds.split) == ('ImageNet', 'data/imagenet', 'train')
    ow = cfg.optim_wrapper
    optim = (ow.type, ow.dtype, ow.optimizer.type, ow.optimizer.lr)
    assert optim == ('DINOAmpOptimWrapper', 'bfloat16', 'AdamW', 5e-4)
    assert ow.clip_grad == dict(max_norm=3.0, per_param=True)
    assert ow.optimizer.weight_decay == 0.04
    assert cfg.auto_scale_lr == dict(base_batch_size=256, enable=True)
    assert cfg.train_cfg.max_epochs == 100
    wd = next(s for s in cfg.param_scheduler if s.get('param_name') == 'weight_decay')
    assert wd.eta_min_ratio * ow.optimizer.weight_decay == pytest.approx(0.4)
    lr = [s for s in cfg.param_scheduler if 'param_name' not in s]
    assert lr[0].end == 10 and lr[1].eta_min == 1e-6 and lr[1].end == 100


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_config_loads_and_builds_tiny(path):
    cfg = Config.fromfile(path)
    assert cfg.default_scope == 'mmpretrain'
    assert cfg.custom_imports.imports == ['mmdinomamba']
    hooks = [h.type for h in cfg.custom_hooks]
    assert hooks[:2] == ['DINOTeacherHook', 'DINOCollapseMonitorHook'] and 'EpochSeedHook' in hooks
    assert cfg.default_hooks.checkpoint.save_last
    m = cfg.model
    depth = MODELS.get(m.backbone.type)._parse_arch(m.backbone.arch)['num_layers']
    tiny = dict(embed_dims=32, num_layers=min(depth, 2))
    if m.backbone.type in ('ViT', 'LinearViT'):
        tiny['num_heads'] = 2
    else:
        m.backbone.mixer_cfg = dict(d_state=8, headdim=16)
    m.backbone.update(arch=tiny, img_size=32)
    m.head.update(in_channels=32, out_channels=64, hidden_channels=32, bottleneck_channels=16)
    init_default_scope('mmpretrain')
    model = MODELS.build(m)
    model.train()
    model.set_progress(0, 10, 5)
    crop = _multicrop(cfg)
    n_views = 2 + crop.num_local_crops
    inputs = [torch.randn(2, 3, 32, 32)] * 2 + [torch.randn(2, 3, 16, 16)] * (n_views - 2)
    out = model.loss(inputs)
    assert torch.isfinite(out['loss'])


def test_demo_config():
    cfg = Config.fromfile(DEMO[0])
    assert cfg.model.backbone.to_dict() == DEMO_BACKBONE
    analysis = Config.fromfile(
        osp.join(ROOT, 'configs/analysis/binary-auc_dinovim-demo_embedded.py'))
    assert analysis.model.backbone.to_dict() == DEMO_BACKBONE
    crop = _multicrop(cfg)
    assert (crop.global_crop_size, crop.local_crop_size) == (64, 32)
    ds = cfg.train_dataloader.dataset
    assert (ds.type, ds.data_root, ds.split) == ('EmbeddedShapes', 'data/embedded', 'train')
    # fp32 on CPU (clipping logged without a host read); --amp switches it
    assert cfg.optim_wrapper.type == 'DINOOptimWrapper'
    assert cfg.train_dataloader.num_workers in (0, 2)
    assert not cfg.train_dataloader.persistent_workers
