"""Every linear-probe config and robustness data-set base loads and builds; Table 1 rows have
the paper's head sizes; Tables 5 / 6 configs change only what they claim."""
import glob
import os.path as osp
import re

import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmpretrain.registry import DATASETS, METRICS, MODELS

from mmdinomamba.models.necks import ProbeFeatureNeck

REPO = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
PROBE = sorted(p for p in glob.glob(osp.join(REPO, 'configs/linear_probe/**/*.py'),
                                    recursive=True) if '/_base_/' not in osp.relpath(p, REPO))
ROBUST = sorted(glob.glob(osp.join(REPO, 'configs/_base_/datasets/imagenet-*_probe_test.py')))
# Table 1: config stem prefix -> (paper head size in M parameters, backbone type)
TABLE1 = {
    'linear-probe_vit-s-p16-4blk_4xb128-coslr': (1.5, 'ViT'),
    'linear-probe_vit-b-p16-1blk-avgpool_4xb128-coslr': (1.5, 'ViT'),
    'linear-probe_linearvit-b-p16-1blk-avgpool_4xb128-coslr': (1.5, 'LinearViT'),
    'linear-probe_dinovim-s-p16-3blk_4xb128-coslr': (1.5, 'DinoVim'),
    'linear-probe_dinovim-b-p16-2blk_4xb128-coslr': (1.5, 'DinoVim'),
    'linear-probe_dinovim-t-p16-8blk_4xb128-coslr': (2.0, 'DinoVim'),
    'linear-probe_dinovim-s-p16-4blk_4xb128-coslr': (2.0, 'DinoVim'),
    'linear-probe_dinovim-b-p16-8blk_4xb128-coslr': (6.2, 'DinoVim'),
    'linear-probe_mambareg-b-p16-8blk_4xb128-coslr': (6.2, 'MambaReg'),
}
DEMO_BACKBONE = dict(type='DinoVim', arch=dict(embed_dims=64, num_layers=4),
                     mixer_cfg=dict(d_state=16, headdim=16), img_size=64, patch_size=8)


def _full_feature_size(cfg) -> int:
    """Feature size of the full-size backbone, from its arch table (no model built)."""
    cls = MODELS.get(cfg.model.backbone.type)
    arch = cls._parse_arch(cfg.model.backbone.arch)
    regs = cfg.model.backbone.get('num_registers', 12) if cls.__name__ == 'MambaReg' else 0
    neck = ProbeFeatureNeck(**{k: v for k, v in cfg.model.neck.items() if k != 'type'})
    return neck.out_channels(arch['embed_dims'], cfg.model.num_blocks, regs)


def test_all_table_configs_exist():
    names = [osp.basename(p) for p in PROBE]
    for prefix in TABLE1:
        assert sum(n.startswith(prefix) for n in names) == 1, prefix
    # Table 5 (9) + Table 6 (4) + base
    assert len([p for p in PROBE if '/ablation/' in osp.relpath(p, REPO)]) == 14
    assert len(ROBUST) == 7


@pytest.mark.parametrize('path', PROBE, ids=osp.basename)
def test_probe_config_loads_and_builds(path):
    cfg = Config.fromfile(path)
    assert cfg.model.type == 'LinearProbe'
    assert cfg.model.backbone.init_cfg.type == 'Pretrained'
    name = osp.basename(path)
    if 'embedded' not in name:
        opt = cfg.optim_wrapper.optimizer
        assert (opt.type, opt.momentum) == ('SGD', 0.9)
        assert cfg.train_cfg.max_epochs == 100 and cfg.param_scheduler[0].T_max == 100
        assert cfg.model.backbone.init_cfg.prefix == 'teacher.backbone.'
        pipe = [t.type for t in cfg.train_dataloader.dataset.pipeline]
        assert pipe == ['LoadImageFromFile', 'RandomResizedCrop', 'RandomFlip', 'PackInputs']
        resize = cfg.val_dataloader.dataset.pipeline[1]
        assert (resize.scale, resize.interpolation) == (256, 'bicubic')
        assert cfg.val_dataloader.dataset.pipeline[2].crop_size == 224
        source = 'block' if 'vit' in name.split('_')[1] and 'dinovim' not in name else 'mixer'
        assert cfg.model.feature_source == source
    for prefix, (head_m, bb_type) in TABLE1.items():
        if name.startswith(prefix):
            assert cfg.model.backbone.type == bb_type
            # 1.536M / 2.048M / 6.144M (the paper prints the last as 6.2)
            assert abs(_full_feature_size(cfg) * 1000 / 1e6 - head_m) < 0.06
            assert (cfg.optim_wrapper.optimizer.lr, cfg.optim_wrapper.optimizer.weight_decay) \
                == (2e-3, 1e-3)
    # build with a tiny backbone of the same type and depth (the full models are slow on CPU)
    init_default_scope('mmpretrain')
    bb = cfg.model.backbone
    arch = MODELS.get(bb.type)._parse_arch(bb.arch)
    tiny = dict(embed_dims=16, num_layers=arch['num_layers'])
    if 'num_heads' in arch:
        tiny['num_heads'] = 2
    else:
        bb.mixer_cfg = dict(d_state=8, headdim=8)
    bb.update(arch=tiny, img_size=32)
    model = MODELS.build(cfg.model)
    assert model.head.fc.in_features == _full_feature_size(cfg)
    assert not any(p.requires_grad for p in model.backbone.parameters())


def test_demo_config_backbone_is_the_demo_dinovim():
    cfg = Config.fromfile(osp.join(REPO, 'configs/linear_probe/'
                                   'linear-probe_dinovim-demo_embedded-64px.py'))
    bb = dict(cfg.model.backbone.to_dict())
    init = bb.pop('init_cfg')
    assert bb == DEMO_BACKBONE
    assert init == dict(type='Pretrained', checkpoint=None, prefix='teacher.backbone.')
    assert cfg.train_dataloader.dataset.split == 'train' and cfg.val_evaluator.type == 'Accuracy'
    assert 10 <= cfg.train_cfg.max_epochs <= 20


def test_ablations_are_deltas_of_the_baseline():
    base = Config.fromfile([p for p in PROBE if p.endswith(
        'ablation/linear-probe_dinovim-s-p16-4blk_4xb128-lr1e-3-wd0-coslr-100e_in1k.py')][0])
    assert (base.model.num_blocks, base.model.neck.pooling) == (4, 'cls')
    assert (base.optim_wrapper.optimizer.lr, base.optim_wrapper.optimizer.weight_decay) == \
        (1e-3, 0.)
    for path in (p for p in PROBE if '/ablation/' in osp.relpath(p, REPO)):
        cfg = Config.fromfile(path)
        name = osp.basename(path)
        n = int(name.split('-p16-')[1][0])
        assert cfg.model.num_blocks == n, name
        lr, wd = re.search(r'_4xb128-lr([0-9.e-]+)-wd([0-9.e-]+)-coslr', name).groups()
        assert cfg.optim_wrapper.optimizer.lr == float(lr), name
        assert cfg.optim_wrapper.optimizer.weight_decay == float(wd), name
        pooling = name.split('-4blk-')[1].split('_')[0].replace('-', '+') \
            if '-4blk-' in name else 'cls'
        assert cfg.model.neck.pooling == pooling, name


@pytest.mark.parametrize('path', ROBUST, ids=osp.basename)
def test_robustness_bases_load(path):
    cfg = Config.fromfile(path)
    ds = cfg.test_dataloader.dataset
    assert DATASETS.get(ds.type) is not None and METRICS.get(cfg.test_evaluator.type) is not None
    name = osp.basename(path)
    if '-v2-' in name:
        assert ds.folder_names == 'index' and cfg.test_evaluator.type == 'Accuracy'
    if name.startswith(('imagenet-a_', 'imagenet-r_')):
        subset = 'imagenet-' + name[9]
        assert ds.subset == cfg.test_evaluator.subset == subset
    if 'real' in name:
        assert ds.type == 'ImageNetReaL' and cfg.test_evaluator.type == 'ReaLAccuracy'
        assert ds.pipeline[-1].algorithm_keys == ['real_labels']
    resize, crop = ds.pipeline[1], ds.pipeline[2]
    assert (resize.scale, resize.interpolation, crop.crop_size) == (256, 'bicubic', 224)
