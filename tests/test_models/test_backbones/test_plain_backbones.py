"""Every preset with a tiny dict arch: shapes, gradients, round trip, freezing, errors, registry.

MILA (hierarchical) is on the same contract: it joins the tests that do not depend on the plain
trunk's token sequence (gradients, round trip, activation checkpointing, the shared argument
checks, the registries)."""
import io

import pytest
import torch

import mmdinomamba  # noqa: F401  (registers everything)
from mmdinomamba.models.backbones import MILA, DinoVim, LinearViT, MambaReg, ViT

TINY_SSD = dict(d_state=8, headdim=16, chunk_size=64)
CASES = {
    'ViT': (ViT, dict(arch=dict(embed_dims=32, num_layers=2, num_heads=2))),
    'LinearViT': (LinearViT, dict(arch=dict(embed_dims=32, num_layers=2, num_heads=2))),
    'DinoVim': (DinoVim, dict(arch=dict(embed_dims=32, num_layers=2), mixer_cfg=TINY_SSD)),
    'DinoVim-legacy': (DinoVim, dict(arch=dict(embed_dims=32, num_layers=2), mixer_cfg=TINY_SSD,
                                     legacy_dinomamba_layout=True)),
    'MambaReg': (MambaReg, dict(arch=dict(embed_dims=32, num_layers=2), mixer_cfg=TINY_SSD)),
    'MILA': (MILA, dict(arch=dict(embed_dims=16, depths=[1, 1, 1, 2], num_heads=[1, 2, 2, 4]))),
}
PLAIN = [name for name in CASES if name != 'MILA']  # one token sequence, a cls token / registers
EXTRA_TOKENS = {'ViT': 1, 'LinearViT': 1, 'DinoVim': 1, 'DinoVim-legacy': 2, 'MambaReg': 12}


def build(name, **kw):
    cls, cfg = CASES[name]
    return cls(**{**cfg, **kw})


@pytest.mark.parametrize('name', PLAIN)
@pytest.mark.parametrize('size', [(96, 96), (224, 224), (256, 309)])
def test_output_shapes(name, size):
    model = build(name, out_indices=(0, -1), out_type='raw').eval()
    h, w = size[0] // 16, size[1] // 16
    x = torch.randn(1, 3, *size)
    with torch.no_grad():
        raw = model(x)
        assert len(raw) == 2
        for t in raw:
            assert t.shape == (1, h * w + EXTRA_TOKENS[name], 32) and torch.isfinite(t).all()
        for out_type, shape in [('cls_token', (1, 32)), ('avg_featmap', (1, 32)),
                                ('featmap', (1, 32, h, w))]:
            model.out_type = out_type
            out = model(x)
            assert len(out) == 2 and all(o.shape == shape for o in out)
        layout = model.token_layout((h, w))
        model.out_type = 'featmap'
        fmap = model(x)[1]
        torch.testing.assert_close(fmap.flatten(2).transpose(1, 2), raw[1][:, layout.patch_index])


@pytest.mark.parametrize('name', list(CASES))
def test_every_parameter_gets_a_gradient(name):
    model = build(name, out_type='raw', drop_path_rate=0.).train()
    out = model(torch.randn(2, 3, 64, 48))[0]
    out.square().mean().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f'{pname} got no gradient'
        assert torch.isfinite(p.grad).all(), f'{pname} has a non-finite gradient'
        assert p.grad.abs().sum() > 0, f'{pname} has an all-zero gradient'


@pytest.mark.parametrize('name', list(CASES))
def test_checkpoint_round_trip(name):
    torch.manual_seed(1)
    model = build(name).eval()
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    torch.manual_seed(2)
    other = build(name).eval()
    x = torch.randn(2, 3, 64, 64)
    assert not torch.allclose(model(x)[0], other(x)[0])
    other.load_state_dict(torch.load(buf))
    torch.testing.assert_close(model(x)[0], other(x)[0], rtol=0, atol=0)


def test_pos_embed_grid_resized_on_load():
    """A 2x2 pos-embed checkpoint loaded into a 4x4-grid model (resized once on load) equals the
    2x2-grid model (resized on every forward) at the 4x4 grid."""
    small = build('MambaReg', img_size=32).eval()
    big = build('MambaReg', img_size=64).eval()
    big.load_state_dict(small.state_dict())
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(big(x)[0], small(x)[0])


@pytest.mark.parametrize('name', ['ViT', 'DinoVim'])
def test_frozen_stages(name):
    model = build(name, frozen_stages=1)
    model.train()
    assert not model.layers[0].training and model.layers[1].training
    assert not model.pos_embed.requires_grad and not model.cls_token.requires_grad
    assert not any(p.requires_grad for p in model.patch_embed.parameters())
    assert not any(p.requires_grad for p in model.layers[0].parameters())
    assert all(p.requires_grad for p in model.layers[1].parameters())
    assert all(p.requires_grad for p in model.norm.parameters())
    full = build(name, frozen_stages=2)
    assert not any(p.requires_grad for p in full.parameters())


@pytest.mark.parametrize('name', ['DinoVim', 'MILA'])
def test_with_cp_matches_plain(name):
    plain = build(name, drop_path_rate=0.).train()
    cp = build(name, drop_path_rate=0., with_cp=True).train()
    cp.load_state_dict(plain.state_dict())
    x = torch.randn(2 if name == 'MILA' else 1, 3, 32, 32)  # MILA: BatchNorm needs 2 images
    plain(x)[0].sum().backward()
    cp(x)[0].sum().backward()
    for (n, a), b in zip(plain.named_parameters(), cp.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=n)


def test_errors():
    with pytest.raises(ValueError, match=r"arch 'x' is not supported.*\['b', 'base', 's'"):
        ViT(arch='x')
    with pytest.raises(ValueError, match=r"missing the key 'num_heads'"):
        ViT(arch=dict(embed_dims=32, num_layers=2))
    with pytest.raises(ValueError, match=r"missing the key 'num_layers'"):
        DinoVim(arch=dict(embed_dims=32))
    with pytest.raises(ValueError, match=r"unknown arch keys \['depth'\]"):
        DinoVim(arch=dict(embed_dims=32, num_layers=2, depth=3))
    with pytest.raises(ValueError, match=r"arch 'l'.*\['b', 'base', 's', 'small', 't', 'tiny'\]"):
        DinoVim(arch='l')
    with pytest.raises(IndexError, match='layer index 2 is out of range.*2 layers'):
        build('ViT', out_indices=(0, 2))
    with pytest.raises(IndexError, match='layer index -3 is out of range'):
        build('DinoVim', out_indices=-3)
    with pytest.raises(ValueError, match="out_type='cls'"):
        build('ViT', out_type='cls')
    with pytest.raises(ValueError, match='frozen_stages=3'):
        build('ViT', frozen_stages=3)
    with pytest.raises(ValueError, match='legacy_dinomamba_layout applies to DinoVim only'):
        build('MambaReg', legacy_dinomamba_layout=True)


def test_builds_from_registries():
    from mmdet.registry import MODELS as DET
    from mmpretrain.registry import MODELS
    from mmseg.registry import MODELS as SEG
    cfg = dict(arch=dict(embed_dims=32, num_layers=2), mixer_cfg=TINY_SSD, out_type='featmap')
    assert isinstance(MODELS.build(dict(type='DinoVim', **cfg)), DinoVim)
    seg = SEG.build(dict(type='mmpretrain.DinoVim', **cfg))
    det = DET.build(dict(type='mmpretrain.MambaReg', **cfg))
    assert isinstance(seg, DinoVim) and isinstance(det, MambaReg)
    assert seg(torch.randn(1, 3, 64, 80))[0].shape == (1, 32, 4, 5)
    vit = SEG.build(dict(type='mmpretrain.LinearViT',
                         arch=dict(embed_dims=32, num_layers=2, num_heads=2)))
    assert isinstance(vit, LinearViT)


@pytest.mark.parametrize('name', ['ViT', 'DinoVim', 'MILA'])
def test_shared_argument_checks(name):
    """One implementation of the arch parsing and argument checks for every backbone: the same
    errors, each naming the class and the value at fault."""
    cls, cfg = CASES[name]
    arch = cfg['arch']
    with pytest.raises(ValueError, match=rf"{cls.__name__}: arch 'x' is not supported"):
        cls(**{**cfg, 'arch': 'x'})
    with pytest.raises(ValueError, match=rf"{cls.__name__}: unknown arch keys \['depth_x'\]"):
        cls(**{**cfg, 'arch': dict(arch, depth_x=1)})
    with pytest.raises(ValueError, match=rf"{cls.__name__}: custom arch dict is missing the key "
                       "'embed_dims'"):
        cls(**{**cfg, 'arch': {k: v for k, v in arch.items() if k != 'embed_dims'}})
    with pytest.raises(ValueError, match=rf"{cls.__name__}: out_type='cls'"):
        cls(**cfg, out_type='cls')
    with pytest.raises(ValueError, match=rf'{cls.__name__}: frozen_stages=9 must be in'):
        cls(**cfg, frozen_stages=9)
    with pytest.raises(IndexError, match='out_indices: (layer|stage) index 7 is out of range'):
        cls(**cfg, out_indices=7)


@pytest.mark.parametrize('name', ['ViT', 'MILA'])
def test_frozen_parts_stay_frozen_in_train_mode(name):
    """``frozen_stages`` + ``norm_eval``: what is frozen has no gradient and stays in eval mode
    through ``train()`` (MILA also keeps its BatchNorms in eval mode)."""
    model = build(name, frozen_stages=1, norm_eval=True).train()
    assert not model.patch_embed.training
    assert not any(p.requires_grad for p in model.patch_embed.parameters())
    assert not model.layers[0].training and not any(p.requires_grad
                                                    for p in model.layers[0].parameters())
    assert all(p.requires_grad for p in model.layers[-1].parameters())
    batchnorms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert all(not m.training for m in batchnorms)


def test_mila_builds_from_registries():
    from mmdet.registry import MODELS as DET
    from mmseg.registry import MODELS as SEG
    cfg = dict(CASES['MILA'][1], out_type='featmap', out_indices=(0, 1, 2, 3))
    for registry in (SEG, DET):
        model = registry.build(dict(type='mmpretrain.MILA', **cfg))
        assert isinstance(model, MILA)
        assert [o.shape[1] for o in model(torch.randn(1, 3, 64, 64))] == [16, 32, 64, 128]
