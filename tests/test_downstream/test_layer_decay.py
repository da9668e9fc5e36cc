"""PlainLayerDecayOptimWrapperConstructor: per-layer lr scales on top of paramwise settings."""
import pytest
from torch import nn

pytest.importorskip('mmdet')
from mmdinomamba.downstream import (  # noqa: E402
    PlainLayerDecayOptimWrapperConstructor, plain_layer_depths)
from mmdinomamba.models.backbones import ViT  # noqa: E402


class _Model(nn.Module):

    def __init__(self):
        super().__init__()
        self.backbone = ViT(arch=dict(embed_dims=16, num_layers=3, num_heads=2), img_size=32)
        self.head = nn.Linear(16, 2)


def _groups(rate, **paramwise):
    model = _Model()
    cfg = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.0, weight_decay=0.1))
    ctor = PlainLayerDecayOptimWrapperConstructor(
        cfg, dict(layer_decay_rate=rate, **paramwise))
    wrapper = ctor(model)
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(g['params'][0])]: g for g in wrapper.optimizer.param_groups}


def test_depths_follow_the_block_index():
    depths = plain_layer_depths(_Model())
    assert depths['backbone.pos_embed'] == depths['backbone.cls_token'] == 0
    assert depths['backbone.patch_embed.proj.weight'] == 0
    assert depths['backbone.layers.0.mixer.qkv.weight'] == 1
    assert depths['backbone.layers.2.norm1.weight'] == 3
    assert depths['backbone.norm.weight'] == depths['head.weight'] == 4


def test_lr_scales_and_paramwise_decay_are_combined():
    groups = _groups(0.5, custom_keys={'pos_embed': dict(decay_mult=0.)})
    assert groups['backbone.pos_embed']['lr'] == pytest.approx(0.5**4)
    assert groups['backbone.pos_embed']['weight_decay'] == 0.
    assert groups['backbone.layers.0.mlp.fc1.weight']['lr'] == pytest.approx(0.5**3)
    assert groups['backbone.layers.2.mixer.proj.bias']['lr'] == pytest.approx(0.5)
    assert groups['backbone.layers.2.mixer.proj.bias']['weight_decay'] == pytest.approx(0.1)
    assert groups['head.weight']['lr'] == pytest.approx(1.0)
    assert groups['backbone.norm.weight']['lr'] == pytest.approx(1.0)


def test_rate_one_changes_nothing():
    groups = _groups(1.0)
    assert all(g.get('lr', 1.0) == 1.0 for g in groups.values())


@pytest.mark.parametrize('rate', [0., 1.5])
def test_bad_rate(rate):
    with pytest.raises(ValueError, match='layer_decay_rate'):
        PlainLayerDecayOptimWrapperConstructor(
            dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1)),
            dict(layer_decay_rate=rate))


def test_model_without_backbone_is_rejected():
    with pytest.raises(TypeError, match='backbone'):
        plain_layer_depths(nn.Linear(2, 2))
