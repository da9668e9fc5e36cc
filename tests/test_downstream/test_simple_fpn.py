"""SimpleFPN (ViTDet pyramid, mmdet registry) and its channel LayerNorm."""
import pytest
import torch

pytest.importorskip('mmdet')
from mmdet.registry import MODELS  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402

from mmdinomamba.downstream import LayerNorm2d, SimpleFPN  # noqa: E402


def test_layernorm2d_matches_per_pixel_reference():
    norm = LayerNorm2d(8)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-1, 1)
    x = torch.randn(2, 8, 3, 5, dtype=torch.float64)
    norm = norm.double()
    mean = x.mean(dim=1, keepdim=True)
    var = x.var(dim=1, unbiased=False, keepdim=True)
    ref = (x - mean) / torch.sqrt(var + 1e-6) * norm.weight.view(1, -1, 1, 1) \
        + norm.bias.view(1, -1, 1, 1)
    torch.testing.assert_close(norm(x), ref)


@pytest.mark.parametrize('hw', [(4, 6), (5, 3)])
def test_simple_fpn_shapes_strides_and_gradients(hw):
    neck = SimpleFPN(in_channels=32, out_channels=16)
    x = torch.randn(2, 32, *hw, requires_grad=True)
    outs = neck((torch.randn(2, 32, *hw), x))  # in_index=-1 picks the last map
    h, w = hw
    expected = [(4 * h, 4 * w), (2 * h, 2 * w), (h, w), (h // 2, w // 2)]
    expected.append(((expected[-1][0] + 1) // 2, (expected[-1][1] + 1) // 2))
    assert [tuple(o.shape) for o in outs] == [(2, 16, *s) for s in expected]
    sum(o.square().mean() for o in outs).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for name, p in neck.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_simple_fpn_tensor_input_and_registry_build():
    init_default_scope('mmdet')
    neck = MODELS.build(dict(type='SimpleFPN', in_channels=16, out_channels=8, num_outs=6,
                             scale_factors=(2.0, 1.0), norm_cfg=dict(type='LN2d')))
    assert isinstance(neck.lateral_convs[0].norm, LayerNorm2d)
    outs = neck(torch.randn(1, 16, 4, 4))
    assert [o.shape[-1] for o in outs] == [8, 4, 2, 1, 1, 1]
    assert all(o.shape[1] == 8 for o in outs)


@pytest.mark.parametrize('kwargs, match', [
    (dict(scale_factors=(3.0, 1.0)), 'scale_factors'),
    (dict(scale_factors=(1.0, 2.0)), 'decreasing'),
    (dict(in_channels=30), 'divisible by 4'),
    (dict(num_outs=3), 'num_outs'),
])
def test_simple_fpn_bad_arguments(kwargs, match):
    args = {**dict(in_channels=32, out_channels=16), **kwargs}
    with pytest.raises(ValueError, match=match):
        SimpleFPN(**args)
