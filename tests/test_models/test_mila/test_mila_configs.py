"""Every MILA config loads and builds; ablation rows have the paper's sizes; demo config trains."""
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config

import mmdinomamba  # noqa: F401  (registers MILA)

CFG_DIR = osp.abspath(osp.join(osp.dirname(__file__), '..', '..', '..', 'configs', 'mila'))
CONFIGS = sorted(glob.glob(osp.join(CFG_DIR, '**', '*.py'), recursive=True))
# Ablation rows (Tables 1-2 of the paper): params in M, our counts within 5%.
ABLATION_PARAMS = {
    '': 28, 'input-gate': 29, 'forget-gate': 29, 'shortcut': 28, 'no-norm': 28,
    'single-head': 24, 'mamba-block': 31, 'ape': 30, 'lepe': 28, 'cpe': 28, 'rope': 28}


def _build(path):
    from mmpretrain.registry import MODELS
    cfg = Config.fromfile(path)
    with torch.device('meta'):
        return cfg, MODELS.build(cfg.model)


def test_all_configs_found():
    names = {osp.basename(p) for p in CONFIGS}
    assert {'mila-t_16xb64_in1k.py', 'mila-s_16xb64_in1k.py', 'mila-b_16xb64_in1k.py',
            'mila-demo_1xb16-2e_embedded.py'} <= names
    assert len([n for n in names if n.startswith('linattn-swin-t')]) == len(ABLATION_PARAMS)


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_config_builds(path):
    cfg, model = _build(path)
    assert cfg.model.backbone.type == 'MILA'
    assert model.head.fc.in_features == model.backbone.stage_dims[-1]
    name = osp.basename(path)
    if name.startswith('linattn-swin-t'):
        key = name[len('linattn-swin-t'):].split('_')[0].lstrip('-')
        params = sum(p.numel() for p in model.parameters()) / 1e6
        assert abs(params - ABLATION_PARAMS[key]) / ABLATION_PARAMS[key] < 0.05, params


def test_ablation_switches_are_single_deltas():
    base = Config.fromfile(osp.join(CFG_DIR, 'ablation', 'linattn-swin-t_16xb64_in1k.py'))
    rope = Config.fromfile(osp.join(CFG_DIR, 'ablation', 'linattn-swin-t-rope_16xb64_in1k.py'))
    assert base.model.backbone.mixer_cfg == dict(block_design='vit', rope=False, lepe=False)
    assert rope.model.backbone.mixer_cfg == dict(block_design='vit', rope=True, lepe=False)
    assert rope.optim_wrapper == base.optim_wrapper


@pytest.mark.slow
def test_demo_config_trains_one_epoch(embedded_root, tmp_path):
    from mmengine.runner import Runner
    cfg = Config.fromfile(osp.join(CFG_DIR, 'mila-demo_1xb16-2e_embedded.py'))
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.update(data_root=str(embedded_root), generate=False)
    cfg.train_cfg.max_epochs = 1
    cfg.work_dir = str(tmp_path)
    runner = Runner.from_cfg(cfg)
    runner.train()
    metrics = runner.val_loop.run()
    assert 0. <= metrics['accuracy/top1'] <= 100.
