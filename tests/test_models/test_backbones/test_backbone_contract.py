"""Every backbone type, MILA included, meets the backbone contract of docs/CONTRACTS.md and works
with the linear probe, the Binary-AUC feature maps and the rank analysis (tiny models)."""
import os.path as osp
import sys

import pytest
import torch
from mmpretrain.registry import MODELS

from mmdinomamba.analysis import compute_featmaps
from mmdinomamba.models.backbones import TokenLayout

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
SSD = dict(d_state=8, headdim=16)
TINY = {
    'ViT': dict(type='ViT', arch=dict(embed_dims=32, num_layers=2, num_heads=2), img_size=32),
    'LinearViT': dict(type='LinearViT', arch=dict(embed_dims=32, num_layers=2, num_heads=2),
                      img_size=32),
    'DinoVim': dict(type='DinoVim', arch=dict(embed_dims=32, num_layers=2), mixer_cfg=SSD,
                    img_size=32),
    'DinoVim-legacy': dict(type='DinoVim', arch=dict(embed_dims=32, num_layers=2),
                           mixer_cfg=SSD, img_size=32, legacy_dinomamba_layout=True),
    'MambaReg': dict(type='MambaReg', arch=dict(embed_dims=32, num_layers=2), mixer_cfg=SSD,
                     img_size=32, num_registers=2),
    'MILA': dict(type='MILA', arch=dict(embed_dims=16, depths=[1, 1, 1, 2],
                                        num_heads=[1, 2, 2, 4]), img_size=64),
}
X = (2, 3, 64, 64)


def _build(name):
    return MODELS.build(TINY[name]).eval()


@pytest.mark.parametrize('name', sorted(TINY))
def test_forward_layers_contract(name):
    model = _build(name)
    x = torch.randn(*X)
    n = model.num_layers
    last = [n - 2, n - 1]  # MILA: both in its last stage
    out = model.forward_layers(x, layers=last, with_mixing=True)
    hw, layout = out['hw'], out['layout']
    assert isinstance(hw, tuple) and len(hw) == 2 and all(isinstance(v, int) for v in hw)
    assert isinstance(layout, TokenLayout) and layout.patch_index.numel() == hw[0] * hw[1]
    width = model.layer_dims[-1]
    for tokens, mixing, layer in zip(out['tokens'], out['mixing'], last):
        assert tokens.shape == (2, layout.length, width)
        assert mixing.shape == (2, model.layers[layer].mixer.num_heads, layout.length,
                                layout.length)
    mixer = model.forward_layers(x, layers=last, source='mixer')['tokens']
    assert all(m.shape == t.shape and not torch.equal(m, t) for m, t in zip(mixer, out['tokens']))
    assert torch.equal(model.forward_layers(x, layers=[-1])['tokens'][0], out['tokens'][1])
    for bad in (n, -n - 1):  # an error, never a wrapped index
        with pytest.raises(IndexError, match=f'layer index {bad} is out of range'):
            model.forward_layers(x, layers=[bad])


@pytest.mark.parametrize('name', sorted(TINY))
@pytest.mark.parametrize('source', ['block', 'mixer'])
def test_linear_probe(name, source):
    neck = dict(type='ProbeFeatureNeck', pooling='mean' if name == 'MILA' else 'cls')
    probe = MODELS.build(dict(type='LinearProbe', backbone=TINY[name], neck=neck, num_blocks=2,
                              feature_source=source,
                              head=dict(type='LinearClsHead', num_classes=3,
                                        loss=dict(type='CrossEntropyLoss'))))
    probe.init_weights()
    feats = probe.extract_feat(torch.randn(*X))[0]
    assert feats.shape == (2, probe.head.fc.in_features) and torch.isfinite(feats).all()
    assert probe(torch.randn(*X), mode='tensor').shape == (2, 3)


def test_linear_probe_on_mila_says_what_to_change():
    head = dict(type='LinearClsHead', num_classes=3, loss=dict(type='CrossEntropyLoss'))
    with pytest.raises(ValueError, match=r"MILA has neither: use neck=dict\("
                       r"type='ProbeFeatureNeck', pooling='mean'\)"):
        MODELS.build(dict(type='LinearProbe', backbone=TINY['MILA'], num_blocks=1, head=head))
    with pytest.raises(ValueError, match=r'widths \[64, 128\] \(they span stages\)'):
        MODELS.build(dict(type='LinearProbe', backbone=TINY['MILA'], num_blocks=3, head=head,
                          neck=dict(type='ProbeFeatureNeck', pooling='mean')))


@pytest.mark.parametrize('name', sorted(TINY))
@pytest.mark.parametrize('map_type', ['mixing', 'cosine'])
def test_featmaps(name, map_type):
    model = _build(name)
    fm = compute_featmaps(model, torch.randn(*X), layers=[-1], map_type=map_type)
    out = model.forward_layers(torch.randn(1, 3, 64, 64), layers=[-1])
    heads = model.layers[-1].mixer.num_heads if map_type == 'mixing' else 1
    queries = max(1, out['layout'].register_index.numel())
    assert fm.maps.shape == (2, 1, heads, queries, *out['hw'])
    assert fm.maps.min() >= 0 and fm.maps.max() <= 1 and torch.isfinite(fm.maps).all()
    assert (fm.query_index == []) == (name == 'MILA')  # MILA: the mean over patch queries


def test_rank_analysis_tool_on_every_backbone(tmp_path):
    sys.path.insert(0, osp.join(ROOT, 'tools', 'analysis'))
    import rank_analysis
    configs = []
    for name, backbone in TINY.items():
        cfg = tmp_path / f'{name}.py'
        cfg.write_text(f'model = dict(type="ImageClassifier", backbone={backbone!r})\n')
        configs.append(str(cfg))
    table = rank_analysis.main([*configs, '--random-init', '--img-size', '64', '--num-images',
                                '1', '--block-size', '4', '--layers', 'all', '--out-dir',
                                str(tmp_path / 'out')])
    layers = {(r['model'], r['layer']) for r in table}
    for name in TINY:
        assert {(name, i) for i in range(_build(name).num_layers)} <= layers, name
    assert all(r['rank_max'] <= 4 for r in table)
