"""The analysis code (feature maps, Binary-AUC evaluator, rank analysis) reads the mixers through
their public API only (``mixing_matrix``, ``mixing_matrices``, ``decay_masks``): never a private
``_...`` method of a mixer (checked in the source and while the analyses run)."""
import ast
import glob
import os.path as osp
import sys

import pytest
import torch
from mmpretrain.registry import MODELS

from mmdinomamba.analysis import compute_featmaps
from mmdinomamba.analysis.rank_model import analyze_layer, capture_mixer_inputs
from mmdinomamba.models.mixers import BiSSD, LinearAttention, SoftmaxAttention
from mmdinomamba.models.mixers.mila import MambaLikeLinearAttention

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
MIXERS = (SoftmaxAttention, LinearAttention, BiSSD, MambaLikeLinearAttention)
ANALYSIS = sorted(glob.glob(osp.join(REPO, 'mmdinomamba/analysis/*.py')) + [
    osp.join(REPO, p) for p in ('tools/analysis/rank_analysis.py',
                                'tools/analysis/visualize_featmap.py',
                                'mmdinomamba/analysis/featmap_evaluator.py')])
SSD = dict(d_state=8, headdim=16)
TINY = {
    'ViT': dict(type='ViT', arch=dict(embed_dims=32, num_layers=2, num_heads=2), img_size=32),
    'LinearViT': dict(type='LinearViT', arch=dict(embed_dims=32, num_layers=2, num_heads=2),
                      img_size=32),
    'DinoVim': dict(type='DinoVim', arch=dict(embed_dims=32, num_layers=2), mixer_cfg=SSD,
                    img_size=32),
    'MambaReg': dict(type='MambaReg', arch=dict(embed_dims=32, num_layers=2), mixer_cfg=SSD,
                     img_size=32, num_registers=2),
    'MILA': dict(type='MILA', arch=dict(embed_dims=16, depths=[1, 1, 1, 2],
                                        num_heads=[1, 2, 2, 4]), img_size=64),
}


def _private_mixer_methods() -> set:
    return {name for cls in MIXERS for name, value in vars(cls).items()
            if name.startswith('_') and not name.startswith('__') and callable(value)}


@pytest.mark.parametrize('path', ANALYSIS, ids=lambda p: osp.relpath(p, REPO))
def test_analysis_source_uses_no_private_mixer_method(path):
    private = _private_mixer_methods()
    assert {'_project', '_conv_params'} <= private
    tree = ast.parse(open(path).read())
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not used & private, f'{path} calls private mixer methods {sorted(used & private)}'


@pytest.fixture
def private_calls(monkeypatch):
    """Record the module of every caller of a private mixer method outside the mixers."""
    calls = []
    for cls in MIXERS:
        for name, fn in list(vars(cls).items()):
            if not (name.startswith('_') and not name.startswith('__') and callable(fn)):
                continue

            def wrapper(*args, _fn=fn, _name=f'{cls.__name__}.{name}', **kwargs):
                caller = sys._getframe(1).f_globals.get('__name__', '')
                if not caller.startswith(('mmdinomamba.models.mixers', 'mmdinomamba.ops')):
                    calls.append((caller, _name))
                return _fn(*args, **kwargs)

            monkeypatch.setattr(cls, name, wrapper)
    return calls


@pytest.mark.parametrize('name', sorted(TINY))
def test_analyses_run_on_the_public_api(name, private_calls):
    backbone = MODELS.build(TINY[name]).double().eval()
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    last = [backbone.num_layers - 2, backbone.num_layers - 1]
    for map_type in ('mixing', 'cosine'):
        compute_featmaps(backbone, x, layers=last, map_type=map_type)
    mixer = backbone.layers[-1].mixer
    with torch.no_grad(), capture_mixer_inputs({1: mixer}) as seen:
        out = backbone.forward_layers(x, layers=[-1])
    records, _ = analyze_layer(mixer, *seen[1], out['layout'].patch_index, [0], block_size=4)
    assert records and not private_calls, private_calls
