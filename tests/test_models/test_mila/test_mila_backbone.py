"""MILA backbone: paper sizes (params, FLOPs), multi-scale outputs, odd sizes, analysis API."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mmdinomamba.models.backbones.mila import MILA

TINY = dict(embed_dims=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 2, 4])
# Paper / MLLA README: params (M) and FLOPs (G, multiply-accumulates) at 224, 1000 classes.
PAPER = {'t': (25., 4.2), 's': (43., 7.3), 'b': (96., 16.2)}


def _count(arch):
    """(params, MACs) of MILA + a 1000-way linear head, built and run on the meta device.

    MACs = FLOPs of matmuls and convolutions (torch's FlopCounterMode) / 2, as Swin and MLLA
    report; norms, activations and element-wise products are not counted.
    """
    with torch.device('meta'):
        net = MILA(arch)
    head = net.stage_dims[-1] * 1000
    params = sum(p.numel() for p in net.parameters()) + head + 1000
    counter = FlopCounterMode(display=False)
    with counter:
        net(torch.empty(1, 3, 224, 224, device='meta'))
    return params, counter.get_total_flops() / 2 + head


@pytest.mark.parametrize('arch', ['t', 's', 'b'])
def test_params_and_flops_match_paper(arch):
    params, macs = _count(arch)
    p_ref, f_ref = PAPER[arch]
    assert abs(params / 1e6 - p_ref) / p_ref < 0.03, params
    assert abs(macs / 1e9 - f_ref) / f_ref < 0.03, macs


def test_arch_zoo_values():
    with torch.device('meta'):
        net = MILA('b')
    assert net.stage_dims == [96, 192, 384, 768] and net.num_layers == 36
    assert [b.mixer.num_heads for b in net.layers][::12] == [3, 12, 12]
    assert net.layers[-1].drop_path.drop_prob == pytest.approx(0.5)
    assert MILA('tiny').layers[-1].drop_path.drop_prob == pytest.approx(0.2)


@pytest.mark.parametrize('size', [(64, 96), (65, 97)])
def test_multiscale_featmaps_any_size(size):
    net = MILA(TINY, out_indices=(0, 1, 2, 3), out_type='featmap')
    outs = net(torch.randn(2, 3, *size))
    h, w = (-(-size[0] // 4), -(-size[1] // 4))
    for s, out in enumerate(outs):
        assert out.shape == (2, 16 * 2**s, h, w)
        h, w = -(-h // 2), -(-w // 2)


def test_out_types_and_negative_indices():
    x = torch.randn(1, 3, 64, 64)
    assert MILA(TINY)(x)[0].shape == (1, 128)  # default: LN -> avg pool of the last stage
    assert MILA(TINY, out_indices=-2, out_type='raw')(x)[0].shape == (1, 16, 64)
    net = MILA(TINY, out_indices=(1, 3), final_norm=False)
    assert [o.shape for o in net(x)] == [(1, 32), (1, 128)]
    assert not hasattr(MILA(TINY), 'norm0')


def test_swin_style_ablation_layers_odd_size():
    net = MILA(TINY, stem='patch', downsample='linear', cpe=False, ape=True, img_size=64,
               out_indices=(0, 3), out_type='featmap',
               mixer_cfg=dict(block_design='vit', rope=False, lepe=False, forget_gate=True))
    outs = net(torch.randn(1, 3, 66, 70))
    assert outs[0].shape == (1, 16, 17, 18) and outs[1].shape == (1, 128, 3, 3)


def test_bad_arguments():
    with pytest.raises(ValueError, match='arch'):
        MILA('huge')
    with pytest.raises(ValueError, match='missing the keys'):
        MILA(dict(embed_dims=16, depths=[1]))
    with pytest.raises(ValueError, match='out_indices'):
        MILA(TINY, out_indices=4)
    with pytest.raises(ValueError, match='no cls token'):
        MILA(TINY, out_type='cls_token')
    with pytest.raises(ValueError, match='patch_size'):
        MILA(TINY, patch_size=16)


def test_every_parameter_gets_gradient():
    net = MILA(TINY, out_indices=(0, 1, 2, 3), out_type='featmap', ape=True, img_size=32)
    net.init_weights()
    sum(o.square().mean() for o in net(torch.randn(2, 3, 32, 40))).backward()
    for name, p in net.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_activation_checkpointing_same_gradients():
    net = MILA(TINY, with_cp=True, drop_path_rate=0.).train()
    x = torch.randn(2, 3, 32, 32)
    net(x)[0].sum().backward()
    grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    net.with_cp = False
    net(x)[0].sum().backward()
    for g, p in zip(grads, net.parameters()):
        torch.testing.assert_close(g, p.grad)


def test_checkpoint_round_trip_and_frozen_stages(tmp_path):
    net = MILA(TINY, frozen_stages=1, norm_eval=True).eval()
    x = torch.randn(1, 3, 48, 48)
    torch.save(net.state_dict(), tmp_path / 'mila.pth')
    other = MILA(TINY).eval()
    other.load_state_dict(torch.load(tmp_path / 'mila.pth'))
    torch.testing.assert_close(other(x)[0], net(x)[0])
    net.train()
    assert not any(p.requires_grad for p in net.patch_embed.parameters())
    assert not any(p.requires_grad for p in net.layers[0].parameters())
    assert all(p.requires_grad for p in net.layers[1].parameters())
    assert not net.patch_embed.conv1.norm.training


def test_forward_layers_mixing_and_layout():
    net = MILA(TINY, out_indices=(2, ))
    x = torch.randn(1, 3, 64, 96)
    out = net.forward_layers(x, layers=[2, 3], with_mixing=True)  # both in stage 2
    assert out['hw'] == (4, 6) and out['layout'].cls_index is None
    assert out['layout'].patch_index.tolist() == list(range(24))
    assert [t.shape for t in out['tokens']] == [(1, 24, 64)] * 2
    assert [m.shape for m in out['mixing']] == [(1, 2, 24, 24)] * 2
    with pytest.raises(ValueError, match=r'blocks \[0, 1, 2, 3, 4\] lie in the stages '
                       r'\[0, 1, 2, 3\].*stage 2: blocks 2\.\.3'):
        net.forward_layers(x, layers=None)  # one grid and layout per call (the contract)
    for bad in (5, -6):  # checked before the index is wrapped (5 used to become block 0)
        with pytest.raises(IndexError, match=f'layer index {bad} is out of range'):
            net.forward_layers(x, layers=[bad])
    feats = net.get_intermediate_layers(x, 2)
    assert [f.shape for f in feats] == [(1, 64), (1, 128)]


def test_stage_output_equals_forward_layers():
    net = MILA(TINY, out_indices=(2, ), out_type='raw').eval()
    x = torch.randn(1, 3, 40, 56)
    torch.testing.assert_close(net.forward_layers(x, [3])['tokens'][0], net(x)[0])


def test_image_classifier_with_linear_head():
    from mmpretrain.registry import MODELS
    model = MODELS.build(dict(
        type='ImageClassifier', backbone=dict(type='MILA', arch=TINY),
        head=dict(type='LinearClsHead', num_classes=5, in_channels=128)))
    assert model(torch.randn(2, 3, 64, 64), mode='tensor').shape == (2, 5)
