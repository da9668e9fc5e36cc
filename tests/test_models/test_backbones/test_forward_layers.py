"""forward_layers / get_intermediate_layers / mixing matrices of the plain backbones."""
import pytest
import torch

import mmdinomamba  # noqa: F401
from mmdinomamba.models.backbones import DinoVim, MambaReg, ViT

TINY_SSD = dict(d_state=8, headdim=16, chunk_size=64)


def _vit():
    return ViT(arch=dict(embed_dims=32, num_layers=3, num_heads=2)).eval()


def test_vit_mixing_equals_attention_weights():
    model = _vit()
    x = torch.randn(2, 3, 48, 64)
    out = model.forward_layers(x, layers=[1, -1], with_mixing=True)
    assert out['hw'] == (3, 4) and out['layout'].length == 13
    assert [t.shape for t in out['tokens']] == [(2, 13, 32)] * 2
    assert [m.shape for m in out['mixing']] == [(2, 2, 13, 13)] * 2
    # recompute by hand: tokens -> layer 0 -> norm1 -> q, k -> softmax(q k^T / sqrt(d))
    tokens, hw, _ = model.embed(x)
    tokens = model.layers[0](tokens, hw)
    layer = model.layers[1]
    h = torch.nn.functional.layer_norm(tokens, (32, ), layer.norm1.weight, layer.norm1.bias, 1e-6)
    qkv = h @ layer.mixer.qkv.weight.T + layer.mixer.qkv.bias
    q, k = (qkv[..., i * 32:(i + 1) * 32].reshape(2, 13, 2, 16).transpose(1, 2) for i in range(2))
    want = torch.softmax(q @ k.transpose(-1, -2) / 4., dim=-1)
    torch.testing.assert_close(out['mixing'][0], want, rtol=1e-5, atol=1e-6)
    # tokens of a layer are the final-normed residual stream
    torch.testing.assert_close(out['tokens'][0], model.norm(layer(tokens, hw)))


def test_forward_layers_consistent_with_forward_and_intermediate():
    model = _vit()
    x = torch.randn(2, 3, 32, 32)
    full = model.forward_layers(x)
    assert len(full['tokens']) == 3 and 'mixing' not in full
    model.out_type = 'raw'
    torch.testing.assert_close(model(x)[0], full['tokens'][-1])
    inter = model.get_intermediate_layers(x, n=2)
    assert len(inter) == 2
    for got, tokens in zip(inter, full['tokens'][1:]):
        torch.testing.assert_close(got, tokens[:, 0])
    with pytest.raises(ValueError, match=r'n=4 must be in \[1, 3\]'):
        model.get_intermediate_layers(x, n=4)


@pytest.mark.parametrize('cls', [DinoVim, MambaReg])
def test_mamba_forward_layers(cls):
    model = cls(arch=dict(embed_dims=32, num_layers=2), mixer_cfg=TINY_SSD).eval()
    x = torch.randn(1, 3, 48, 48)
    out = model.forward_layers(x, layers=[0], with_mixing=True)
    layout = out['layout']
    heads = model.layers[0].mixer.num_heads
    assert out['mixing'][0].shape == (1, heads, layout.length, layout.length)
    # the mixing matrix is that of the block's mixer on norm1 of the embedded tokens
    tokens, hw, _ = model.embed(x)
    want = model.layers[0].mixer.mixing_matrix(model.layers[0].norm1(tokens), hw)
    torch.testing.assert_close(out['mixing'][0], want)
    inter = model.get_intermediate_layers(x, n=2, source='mixer')
    assert [t.shape for t in inter] == [(1, 32)] * 2
    mixer_out = model.forward_layers(x, source='mixer')['tokens'][-1]
    torch.testing.assert_close(inter[-1], model.cls_feature(mixer_out, layout))
    if cls is MambaReg:  # cls feature = mean over the registers
        model.out_type = 'raw'
        raw = model(x)[0]
        torch.testing.assert_close(model.get_intermediate_layers(x, 1)[0],
                                   raw[:, layout.register_index].mean(1))
