"""Every seg / det config loads, matches the paper's Appendix C where it claims to, is
consistent (backbone width = neck / head channels, evenly spaced blocks) and builds with a
tiny backbone of the same type and depth."""
import glob
import os.path as osp

import pytest

pytest.importorskip('mmseg')
pytest.importorskip('mmdet')
from mmengine.config import Config  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402
from mmpretrain.registry import MODELS as PRETRAIN_MODELS  # noqa: E402
from repo_files import load_file  # noqa: E402  (tests/ is on sys.path)

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SEG = sorted(glob.glob(osp.join(REPO, 'configs/seg/*.py')))
DET = sorted(glob.glob(osp.join(REPO, 'configs/det/*.py')))
HIERARCHICAL = ('MILA', )


def _settings_tool():
    return load_file('tools/analysis/print_config_settings.py')


def _backbone_class(cfg):
    scope, name = cfg.model.backbone.type.split('.')
    assert scope == 'mmpretrain'
    return PRETRAIN_MODELS.get(name)


def _arch(cls, arch):
    if cls.__name__ in HIERARCHICAL:
        return cls.arch_zoo[arch] if isinstance(arch, str) else arch
    return cls._parse_arch(arch)


def _is_hierarchical(cfg):
    return cfg.model.backbone.type.split('.')[1] in HIERARCHICAL


def _tiny_hierarchical(cfg, width=16):
    """MILA: same depths, stage widths ``width * 2**i`` (heads / neck follow)."""
    bb = cfg.model.backbone
    depths = _arch(_backbone_class(cfg), bb.arch)['depths']
    bb.update(arch=dict(embed_dims=width, depths=depths, num_heads=[1, 1, 2, 2]), init_cfg=None)
    dims = [width * 2**i for i in range(4)]
    if cfg.default_scope == 'mmseg':
        cfg.model.decode_head.update(in_channels=dims, channels=width)
        cfg.model.auxiliary_head.update(in_channels=dims[2], channels=width)
    else:
        cfg.model.neck.update(in_channels=dims, out_channels=width)
        cfg.model.rpn_head.update(in_channels=width, feat_channels=width)
    return cfg


def _check_hierarchical(cfg, is_seg):
    """Stage maps feed UPerHead (no neck) or mmdet's FPN directly."""
    bb = cfg.model.backbone
    arch = _arch(_backbone_class(cfg), bb.arch)
    dims = [arch['embed_dims'] * 2**i for i in range(len(arch['depths']))]
    assert tuple(bb.out_indices) == (0, 1, 2, 3)
    if is_seg:
        assert cfg.model.get('neck') is None and cfg.model.decode_head.in_channels == dims
        assert cfg.model.auxiliary_head.in_channels == dims[cfg.model.auxiliary_head.in_index]
    else:
        assert cfg.model.neck.type == 'FPN' and cfg.model.neck.in_channels == dims
    return 'backbone.'  # supervised ImageNet classifier checkpoint


def _tiny(cfg, width=32):
    """Same backbone type and depth, ``width`` channels (neck / heads follow)."""
    if _is_hierarchical(cfg):
        return _tiny_hierarchical(cfg)
    bb = cfg.model.backbone
    arch = _arch(_backbone_class(cfg), bb.arch)
    tiny = dict(embed_dims=width, num_layers=arch['num_layers'])
    if 'num_heads' in arch:
        tiny['num_heads'] = 2
    else:
        bb.mixer_cfg = dict(d_state=8, headdim=16)
    bb.update(arch=tiny, init_cfg=None)
    if cfg.default_scope == 'mmseg':
        cfg.model.neck.update(in_channels=[width] * 4, out_channels=width)
        cfg.model.decode_head.update(in_channels=[width] * 4, channels=width)
        cfg.model.auxiliary_head.update(in_channels=width, channels=width)
    else:
        cfg.model.neck.in_channels = width
    return cfg


def test_all_configs_found():
    assert len(SEG) >= 4 and len(DET) >= 4


@pytest.mark.parametrize('path', SEG + DET, ids=osp.basename)
def test_config_loads_is_consistent_and_builds(path):
    cfg = Config.fromfile(path)
    is_seg = path in SEG
    assert cfg.default_scope == ('mmseg' if is_seg else 'mmdet')
    assert cfg.custom_imports.imports == ['mmdinomamba', 'mmdinomamba.downstream']
    bb = cfg.model.backbone
    assert bb.out_type == 'featmap'
    arch = _arch(_backbone_class(cfg), bb.arch)
    if _is_hierarchical(cfg):
        prefix, depth = _check_hierarchical(cfg, is_seg), sum(arch['depths'])
    else:
        prefix, depth = 'teacher.backbone.', _check_plain(cfg, arch, is_seg)
    if 'embedded' not in path:  # the paper settings
        rows = _settings_tool().check_against_paper(cfg)
        assert rows and all(ok for *_, ok in rows), [r for r in rows if not r[-1]]
        assert bb.init_cfg.type == 'Pretrained' and bb.init_cfg.prefix == prefix
    init_default_scope(cfg.default_scope)
    registry = __import__(f'{cfg.default_scope}.registry', fromlist=['MODELS']).MODELS
    model = registry.build(_tiny(cfg).model)
    assert type(model.backbone).__name__ == bb.type.split('.')[1]
    assert model.backbone.num_layers == depth


def _check_plain(cfg, arch, is_seg):
    """Evenly spaced blocks (seg) or the last block (det) feed a neck of the backbone width."""
    bb = cfg.model.backbone
    width, depth = arch['embed_dims'], arch['num_layers']
    if is_seg:
        step = depth // 4
        assert tuple(bb.out_indices) == tuple(range(step - 1, depth, step))
        assert cfg.model.neck.in_channels == [width] * 4 == cfg.model.decode_head.in_channels
        assert cfg.model.auxiliary_head.in_channels == width
        assert cfg.model.decode_head.num_classes == cfg.model.auxiliary_head.num_classes
    else:
        assert tuple(bb.out_indices) == (-1, ) and cfg.model.neck.in_channels == width
    return depth


def test_print_config_settings_cli(capsys):
    tool = _settings_tool()
    seg = osp.join(REPO, 'configs/seg/upernet_dinovim-b_8xb2-160k_ade20k-512x512.py')
    det = osp.join(REPO, 'configs/det/cascade-mask-rcnn_dinovim-b-simplefpn_8xb2-1x_coco.py')
    assert tool.main([seg, det, '--check']) == 0
    out = capsys.readouterr().out
    assert 'optimizer.lr: 6e-05' in out and 'optimizer.lr: 0.0001' in out
    assert "PolyLR(eta_min=0.0, power=1.0, by_epoch=False, begin=1500, end=160000)" in out
    assert "Resize(scale=(1333, 800), keep_ratio=True)" in out
    assert '8 GPUs' in out and 'DIFF' not in out
    demo = [p for p in SEG if 'embedded' in osp.basename(p)][0]
    assert tool.main([demo, '--check']) == 1
    assert '[DIFF] lr' in capsys.readouterr().out
