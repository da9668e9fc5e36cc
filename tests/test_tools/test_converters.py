"""Checkpoint converters: official-shaped state dicts (random values, tiny widths) -> our models.

The official key layouts (facebookresearch/dino ``vision_transformer.py``; yangtiming/Dino-Mamba
``models_vim.py``, ``models_mambar.py``, ``mamba2.py``) are rebuilt here from the published
shapes; the reference forwards below are independent re-implementations of those models.
"""
import math
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F

import mmdinomamba  # noqa: F401
from mmdinomamba.models.backbones import DinoVim, MambaReg, ViT
from repo_files import load_file


def _load_tool(name):
    return load_file(f'tools/model_converters/{name}.py')


dino_vit2mmdm = _load_tool('dino_vit2mmdm')
dinomamba2mmdm = _load_tool('dinomamba2mmdm')


# ---- DINO ViT -----------------------------------------------------------------------------
C, DEPTH, HEADS, PATCH = 32, 2, 2, 16


def official_dino_vit(grid=4):
    """Random weights in DINO's ViT key layout (pos_embed (1, 1 + grid^2, C), cls first)."""
    g = torch.Generator().manual_seed(0)

    def r(*shape, s=0.2):
        return torch.randn(*shape, generator=g) * s

    sd = {'cls_token': r(1, 1, C), 'pos_embed': r(1, 1 + grid * grid, C),
          'patch_embed.proj.weight': r(C, 3, PATCH, PATCH, s=0.05),
          'patch_embed.proj.bias': r(C), 'norm.weight': 1 + r(C), 'norm.bias': r(C)}
    for i in range(DEPTH):
        p = f'blocks.{i}.'
        sd.update({p + 'norm1.weight': 1 + r(C), p + 'norm1.bias': r(C),
                   p + 'attn.qkv.weight': r(3 * C, C), p + 'attn.qkv.bias': r(3 * C),
                   p + 'attn.proj.weight': r(C, C), p + 'attn.proj.bias': r(C),
                   p + 'norm2.weight': 1 + r(C), p + 'norm2.bias': r(C),
                   p + 'mlp.fc1.weight': r(4 * C, C), p + 'mlp.fc1.bias': r(4 * C),
                   p + 'mlp.fc2.weight': r(C, 4 * C), p + 'mlp.fc2.bias': r(C)})
    return sd


def dino_interpolate(pos, grid_hw, n_side):
    """DINO's interpolate_pos_encoding for the patch rows: bicubic, scale (h + 0.1) / sqrt(N)."""
    h, w = grid_hw
    if (h, w) == (n_side, n_side):
        return pos
    grid = pos.reshape(1, n_side, n_side, -1).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, scale_factor=((h + 0.1) / n_side, (w + 0.1) / n_side),
                         mode='bicubic')
    return grid.permute(0, 2, 3, 1).reshape(1, h * w, -1)


def reference_dino_vit(sd, x):
    """DINO ViT forward on official keys; returns the final-normed tokens (B, 1 + N, C)."""
    ln = lambda t, p: F.layer_norm(t, (C, ), sd[p + '.weight'], sd[p + '.bias'], 1e-6)  # noqa
    lin = lambda t, p: F.linear(t, sd[p + '.weight'], sd[p + '.bias'])  # noqa
    patches = F.conv2d(x, sd['patch_embed.proj.weight'], sd['patch_embed.proj.bias'], stride=16)
    hw = patches.shape[-2:]
    t = torch.cat([sd['cls_token'].expand(x.shape[0], -1, -1), patches.flatten(2).mT], 1)
    n_side = math.isqrt(sd['pos_embed'].shape[1] - 1)
    pos = sd['pos_embed']
    t = t + torch.cat([pos[:, :1], dino_interpolate(pos[:, 1:], hw, n_side)], 1)
    B, L, d = t.shape[0], t.shape[1], C // HEADS
    for i in range(DEPTH):
        p = f'blocks.{i}.'
        q, k, v = lin(ln(t, p + 'norm1'), p + 'attn.qkv').reshape(B, L, 3, HEADS, d).permute(
            2, 0, 3, 1, 4)
        attn = torch.softmax(q @ k.mT * d**-0.5, -1)
        t = t + lin((attn @ v).transpose(1, 2).reshape(B, L, C), p + 'attn.proj')
        t = t + lin(F.gelu(lin(ln(t, p + 'norm2'), p + 'mlp.fc1')), p + 'mlp.fc2')
    return ln(t, 'norm')


def _tiny_vit(**kw):
    return ViT(arch=dict(embed_dims=C, num_layers=DEPTH, num_heads=HEADS), img_size=64, **kw)


def test_dino_vit_round_trip_equal_outputs():
    official = official_dino_vit()
    full_ckpt = {'teacher': {**{'backbone.' + k: v for k, v in official.items()},
                             'head.mlp.0.weight': torch.zeros(4, C)},
                 'student': {'module.backbone.' + k: v for k, v in official.items()}}
    for key in ('teacher', 'student'):
        converted, dropped = dino_vit2mmdm.convert_dino_vit(full_ckpt[key])
        assert dropped == (['head.mlp.0.weight'] if key == 'teacher' else [])
        model = _tiny_vit(out_type='raw').eval()
        result = model.load_state_dict(converted, strict=True)
        assert not result.missing_keys and not result.unexpected_keys
    for size in [(64, 64), (96, 96), (64, 112)]:  # stored grid, resized, non-square
        x = torch.randn(2, 3, *size)
        torch.testing.assert_close(model(x)[0], reference_dino_vit(official, x),
                                   rtol=1e-4, atol=1e-5)


def test_dino_vit_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(ViT.arch_zoo, 'tiny-test', dict(embed_dims=C, num_layers=DEPTH,
                                                        num_heads=HEADS))
    src, dst = tmp_path / 'dino.pth', tmp_path / 'out.pth'
    torch.save({'teacher': {'backbone.' + k: v for k, v in official_dino_vit().items()}}, src)
    assert dino_vit2mmdm.main([str(src), str(dst), '--key', 'teacher', '--arch', 'tiny-test']) == 0
    assert 'missing keys: 0' in capsys.readouterr().out
    saved = torch.load(dst)
    assert saved['meta']['model_cfg'] == dict(type='ViT', arch='tiny-test', patch_size=16,
                                              img_size=64)
    _tiny_vit().load_state_dict(saved['state_dict'])
    # a broken checkpoint is reported and not written
    broken = official_dino_vit()
    del broken['blocks.1.attn.proj.weight']
    broken['blocks.1.attn.extra'] = torch.zeros(1)
    torch.save(broken, src)
    assert dino_vit2mmdm.main([str(src), str(tmp_path / 'bad.pth'), '--arch', 'tiny-test']) == 1
    out = capsys.readouterr().out
    assert 'missing keys: 1\n  layers.1.mixer.proj.weight' in out
    assert 'unexpected keys: 1\n  layers.1.mixer.extra' in out
    assert not (tmp_path / 'bad.pth').exists()


# ---- Dino-Mamba DinoVim / Mamba-Reg -------------------------------------------------------
SSD = dict(d_state=8, headdim=16)  # tiny Mamba-2: d_inner 64, 4 heads


def official_mixer(prefix, r, d_state=8, headdim=16):
    """Dino-Mamba ``mamba2.Mamba2`` (bimamba v2) keys and shapes for d_model = C."""
    d_inner = 2 * C
    heads, conv_dim = d_inner // headdim, d_inner + 2 * d_state
    sd = {prefix + 'in_proj.weight': r(2 * d_inner + 2 * d_state + heads, C),
          prefix + 'out_proj.weight': r(C, d_inner)}
    for sfx, dt_name in (('', 'dt_bias'), ('_b', 'dt_b_bias')):
        sd.update({prefix + f'conv1d{sfx}.weight': r(conv_dim, 1, 4),
                   prefix + f'conv1d{sfx}.bias': r(conv_dim),
                   prefix + dt_name: torch.log(torch.expm1(0.01 + r(heads).abs())),
                   prefix + f'A_log{sfx}': torch.log(1 + 15 * r(heads).abs()),
                   prefix + f'D{sfx}': 1 + r(heads),
                   prefix + f'norm{sfx}.weight': 1 + r(d_inner)})
    return sd


def official_dinomamba(kind, grid, n_reg=12, **mixer):
    g = torch.Generator().manual_seed(0)

    def r(*shape, s=0.2):
        return torch.randn(*shape, generator=g) * s

    sd = {'patch_embed.proj.weight': r(C, 3, PATCH, PATCH, s=0.05),
          'patch_embed.proj.bias': r(C), 'norm_f.weight': 1 + r(C)}
    if kind == 'DinoVim':
        sd.update(cls_token=r(1, 1, C), pos_embed=r(1, 1 + grid * grid, C))
    else:
        sd.update(cls_token=r(1, n_reg, C), pos_embed=r(1, grid * grid, C),
                  pos_embed_cls=r(1, n_reg, C))
    for i in range(DEPTH):
        sd[f'layers.{i}.norm.weight'] = 1 + r(C)
        sd.update(official_mixer(f'layers.{i}.mixer.', r, **mixer))
    return sd


def _rms(t, w, eps=1e-5):
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w


def _ssd_recurrence(x, dt, A, Bm, Cm, D):
    """h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t (one group)."""
    state = x.new_zeros(*x.shape[:1], *x.shape[2:], Bm.shape[-1])  # (B, h, p, n)
    ys = []
    for t in range(x.shape[1]):
        decay = torch.exp(dt[:, t] * A)[..., None, None]
        state = state * decay + (dt[:, t, :, None, None] * x[:, t, ..., None]
                                 * Bm[:, t, None, None, :])
        ys.append((state * Cm[:, t, None, None, :]).sum(-1) + D[:, None] * x[:, t])
    return torch.stack(ys, 1)


def _mamba2_direction(zxbcdt, sd, p, sfx, dt_name, d_state, headdim):
    B, L, _ = zxbcdt.shape
    d_inner = 2 * C
    heads = d_inner // headdim
    z, xbc, dt = zxbcdt.split([d_inner, d_inner + 2 * d_state, heads], -1)
    conv_w = sd[p + f'conv1d{sfx}.weight']
    xbc = F.conv1d(xbc.mT, conv_w, sd[p + f'conv1d{sfx}.bias'], padding=3,
                   groups=conv_w.shape[0])[..., :L]
    x, Bm, Cm = F.silu(xbc).mT.split([d_inner, d_state, d_state], -1)
    dt = F.softplus(dt + sd[p + dt_name])
    y = _ssd_recurrence(x.reshape(B, L, heads, headdim), dt, -torch.exp(sd[p + f'A_log{sfx}']),
                        Bm, Cm, sd[p + f'D{sfx}']).reshape(B, L, d_inner)
    return _rms(y * F.silu(z), sd[p + f'norm{sfx}.weight'])  # norm_before_gate=False


def reference_mamba2_v2(u, sd, p, d_state=8, headdim=16):
    """Dino-Mamba's bidirectional Mamba-2: shared in/out proj, flipped backward, averaged."""
    zxbcdt = u @ sd[p + 'in_proj.weight'].T
    fwd = _mamba2_direction(zxbcdt, sd, p, '', 'dt_bias', d_state, headdim)
    bwd = _mamba2_direction(zxbcdt.flip(1), sd, p, '_b', 'dt_b_bias', d_state, headdim)
    return ((fwd + bwd.flip(1)) / 2) @ sd[p + 'out_proj.weight'].T


def reference_dinomamba(sd, x, kind, **mixer):
    """models_vim / models_mambar forward (add -> RMSNorm -> mixer blocks, final add + norm_f).

    Returns (output feature (B, C), per-layer norm_f(mixer output) cls features)."""
    patches = F.conv2d(x, sd['patch_embed.proj.weight'], sd['patch_embed.proj.bias'], stride=16)
    hw, B = patches.shape[-2:], x.shape[0]
    patches = patches.flatten(2).mT
    if kind == 'DinoVim':  # DINO prepare_tokens, then the cls inserted again at M // 2
        pos = sd['pos_embed']
        n_side = math.isqrt(pos.shape[1] - 1)
        t = torch.cat([sd['cls_token'].expand(B, -1, -1), patches], 1)
        t = t + torch.cat([pos[:, :1], dino_interpolate(pos[:, 1:], hw, n_side)], 1)
        mid = t.shape[1] // 2
        t = torch.cat([t[:, :mid], sd['cls_token'].expand(B, -1, -1), t[:, mid:]], 1)
        cls_pos = [mid]
    else:  # patches + pos, registers spread by get_cls_idx
        n_side = math.isqrt(sd['pos_embed'].shape[1])
        t = patches + dino_interpolate(sd['pos_embed'], hw, n_side)
        n_reg, n_tok = sd['cls_token'].shape[1], t.shape[1]
        group = n_tok // (n_reg + 1)
        order, cls_pos = [], []
        for r_ in range(n_reg):
            order += list(range(r_ * group, (r_ + 1) * group))
            cls_pos.append(len(order))
            order.append(n_tok + r_)
        order += list(range(group * n_reg, n_tok))
        t = torch.cat([t, (sd['cls_token'] + sd['pos_embed_cls']).expand(B, -1, -1)], 1)[:, order]
    residual, hidden, inter = None, t, []
    for i in range(DEPTH):
        residual = hidden if residual is None else residual + hidden
        hidden = reference_mamba2_v2(_rms(residual, sd[f'layers.{i}.norm.weight']), sd,
                                     f'layers.{i}.mixer.', **mixer)
        inter.append(_rms(hidden[:, cls_pos], sd['norm_f.weight']).mean(1))
    out = _rms(residual + hidden, sd['norm_f.weight'])
    return out[:, cls_pos].mean(1), inter


@pytest.mark.parametrize('kind', ['DinoVim', 'MambaReg'])
def test_dinomamba_round_trip_equal_outputs(kind):
    grid = 4 if kind == 'DinoVim' else 2  # Mamba-Reg: a small stored grid, like its 7x7 @ 112
    official = official_dinomamba(kind, grid, **SSD)
    ckpt = {'teacher': {**{'backbone.' + k: v for k, v in official.items()},
                        'head.last_layer.weight_g': torch.ones(1)}}
    converted, dropped, got_kind = dinomamba2mmdm.convert_dinomamba(ckpt['teacher'])
    assert got_kind == kind and dropped == ['head.last_layer.weight_g']
    arch = dict(embed_dims=C, num_layers=DEPTH)
    if kind == 'DinoVim':
        model = DinoVim(arch=arch, mixer_cfg=SSD, img_size=64, legacy_dinomamba_layout=True)
    else:
        model = MambaReg(arch=arch, mixer_cfg=SSD, img_size=32)
    result = model.eval().load_state_dict(converted, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    for size in [(64, 64), (96, 96), (48, 80)]:
        x = torch.randn(2, 3, *size)
        want, want_inter = reference_dinomamba(official, x, kind, **SSD)
        torch.testing.assert_close(model(x)[0], want, rtol=1e-4, atol=1e-4)
        inter = model.get_intermediate_layers(x, DEPTH, source='mixer')
        for got, ref in zip(inter, want_inter):
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_dinomamba_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(DinoVim.arch_zoo, 'tiny-test', dict(embed_dims=C, num_layers=DEPTH))
    official = official_dinomamba('DinoVim', 4, d_state=64, headdim=64)  # default mixer
    src, dst = tmp_path / 'vim.pth', tmp_path / 'out.pth'
    torch.save({'teacher': {'backbone.' + k: v for k, v in official.items()},
                'student': {}}, src)
    assert dinomamba2mmdm.main([str(src), str(dst), '--arch', 'tiny-test']) == 0
    assert 'missing keys: 0\nunexpected keys: 0' in capsys.readouterr().out
    saved = torch.load(dst)
    assert saved['meta']['model_cfg'] == dict(type='DinoVim', arch='tiny-test', patch_size=16,
                                              img_size=64, legacy_dinomamba_layout=True)
    model = DinoVim(arch='tiny-test', img_size=64, legacy_dinomamba_layout=True)
    model.load_state_dict(saved['state_dict'])
    del official['layers.1.mixer.D_b']
    torch.save(official, src)
    assert dinomamba2mmdm.main([str(src), str(dst), '--arch', 'tiny-test']) == 1
    assert 'missing keys: 1' in capsys.readouterr().out


def _converted_file(tmp_path, official, record=True):
    """A converted official DinoVim file (``record=False``: as written before the converter
    recorded the layout in the weights; its meta still says legacy_dinomamba_layout=True)."""
    converted, _, _ = dinomamba2mmdm.convert_dinomamba(official)
    if not record:
        converted = OrderedDict(converted)  # no _metadata
    cfg = dinomamba2mmdm.infer_vim_cfg(converted, 'DinoVim', 'b')
    path = tmp_path / ('vim.pth' if record else 'vim_old.pth')
    torch.save(dict(state_dict=converted, meta=dict(model_cfg=cfg)), path)
    return str(path)


@pytest.mark.parametrize('record', [True, False])
def test_converted_dinovim_needs_the_legacy_layout(tmp_path, record):
    """Same parameters, different features: loading a converted official DinoVim into the
    default middle-cls layout is an error saying what to set; with it, the official features."""
    from mmpretrain.registry import MODELS

    from mmdinomamba.models.utils import CheckpointMismatchError
    official = official_dinomamba('DinoVim', 4, **SSD)
    path = _converted_file(tmp_path, official, record)
    arch = dict(embed_dims=C, num_layers=DEPTH)
    probe = dict(type='LinearProbe', num_blocks=DEPTH, feature_source='mixer',
                 head=dict(type='LinearClsHead', num_classes=3, loss=dict(type='CrossEntropyLoss')))
    for legacy in (False, True):
        backbone = dict(type='DinoVim', arch=arch, mixer_cfg=SSD, img_size=64,
                        legacy_dinomamba_layout=legacy,
                        init_cfg=dict(type='Pretrained', checkpoint=path,
                                      prefix='teacher.backbone.'))
        model = MODELS.build(dict(probe, backbone=backbone)).eval()
        if not legacy:
            with pytest.raises(CheckpointMismatchError,
                               match=f"{path}.*token layout 'legacy_dinomamba'.*"
                               r'set legacy_dinomamba_layout=True'):
                model.init_weights()
            continue
        model.init_weights()
        x = torch.randn(2, 3, 64, 64)
        want = torch.cat(reference_dinomamba(official, x, 'DinoVim', **SSD)[1], dim=1)
        torch.testing.assert_close(model.extract_feat(x)[0], want, rtol=1e-4, atol=1e-4)
    # a Binary-AUC evaluator through tools/test.py's strict load
    from mmdinomamba.models.utils import load_checkpoint_strict
    for legacy in (False, True):
        evaluator = MODELS.build(dict(type='FeatMapEvaluator', backbone=dict(
            type='DinoVim', arch=arch, mixer_cfg=SSD, img_size=64,
            legacy_dinomamba_layout=legacy)))
        if legacy:
            load_checkpoint_strict(evaluator, path)
        else:
            with pytest.raises(CheckpointMismatchError, match='legacy_dinomamba_layout=True'):
                load_checkpoint_strict(evaluator, path)
    if record:  # a plain load_state_dict checks it too
        with pytest.raises(CheckpointMismatchError, match='legacy_dinomamba_layout=True'):
            DinoVim(arch=arch, mixer_cfg=SSD, img_size=64).load_state_dict(
                torch.load(path)['state_dict'])


# ---- safe output, wrong converter, default entry ------------------------------------------
def _vit_training_ckpt():
    """A DINO ViT training checkpoint: teacher / student entries, no plain weights."""
    official = official_dino_vit()
    student = {'module.backbone.' + k: torch.zeros_like(v) for k, v in official.items()}
    return official, {'teacher': {'backbone.' + k: v for k, v in official.items()},
                      'student': student, 'epoch': 7}


@pytest.mark.parametrize('tool', ['dino_vit2mmdm', 'dinomamba2mmdm'])
def test_converters_refuse_to_overwrite_their_input(tool, tmp_path, capsys):
    import os
    ckpt = _vit_training_ckpt()[1] if tool == 'dino_vit2mmdm' else {
        'teacher': official_dinomamba('DinoVim', 4, **SSD), 'epoch': 7}
    src = tmp_path / 'train.pth'
    torch.save(ckpt, src)
    os.symlink(src, tmp_path / 'link.pth')
    os.link(src, tmp_path / 'hard.pth')
    before = src.read_bytes()
    module = dino_vit2mmdm if tool == 'dino_vit2mmdm' else dinomamba2mmdm
    for dst in (src, tmp_path / '.' / 'train.pth', tmp_path / 'link.pth', tmp_path / 'hard.pth'):
        assert module.main([str(src), str(dst), '--arch', 'b']) == 1
        assert 'refusing to overwrite the input checkpoint' in capsys.readouterr().err
    assert src.read_bytes() == before  # teacher, student and epoch are all still there


def test_save_atomic_never_leaves_a_half_written_file(tmp_path, monkeypatch):
    from mmdinomamba.models.utils import save_atomic
    dst = tmp_path / 'out.pth'
    save_atomic({'a': torch.ones(2)}, str(dst))
    good = dst.read_bytes()

    def broken_save(obj, f):
        open(f, 'wb').write(b'partial')
        raise OSError('disk full')

    monkeypatch.setattr(torch, 'save', broken_save)
    with pytest.raises(OSError, match='disk full'):
        save_atomic({'a': torch.zeros(2)}, str(dst))
    assert dst.read_bytes() == good and sorted(p.name for p in tmp_path.iterdir()) == ['out.pth']


def test_each_converter_names_the_other_for_the_other_model(tmp_path, capsys):
    vit, vim = tmp_path / 'vit.pth', tmp_path / 'vim.pth'
    torch.save(_vit_training_ckpt()[1], vit)
    torch.save({'teacher': {'backbone.' + k: v for k, v in
                            official_dinomamba('DinoVim', 4, **SSD).items()}}, vim)
    assert dinomamba2mmdm.main([str(vit), str(tmp_path / 'o1.pth')]) == 1
    err = capsys.readouterr().err
    assert f'{vit} holds a ViT' in err and 'tools/model_converters/dino_vit2mmdm.py' in err
    assert dino_vit2mmdm.main([str(vim), str(tmp_path / 'o2.pth')]) == 1
    err = capsys.readouterr().err
    assert f'{vim} holds a Dino-Mamba model' in err and 'dinomamba2mmdm.py' in err
    assert not list(tmp_path.glob('o*.pth'))


def test_dino_vit_converter_reads_the_teacher_and_names_missing_keys(tmp_path, monkeypatch,
                                                                     capsys):
    monkeypatch.setitem(ViT.arch_zoo, 'tiny-test', dict(embed_dims=C, num_layers=DEPTH,
                                                        num_heads=HEADS))
    official, ckpt = _vit_training_ckpt()
    src, dst = tmp_path / 'train.pth', tmp_path / 'out.pth'
    torch.save(ckpt, src)
    assert dino_vit2mmdm.main([str(src), str(dst), '--arch', 'tiny-test']) == 0
    saved = torch.load(dst)
    assert saved['meta']['key'] == 'teacher'
    assert torch.equal(saved['state_dict']['cls_token'], official['cls_token'])
    broken = {k: v for k, v in official.items() if k != 'cls_token'}
    torch.save(broken, src)
    assert dino_vit2mmdm.main([str(src), str(dst), '--arch', 'tiny-test']) == 1
    err = capsys.readouterr().err
    assert f"{src}: the weights have no ['cls_token']" in err and "'blocks'" in err
    torch.save({'student': ckpt['student'], 'epoch': 7}, src)
    assert dino_vit2mmdm.main([str(src), str(dst), '--key', 'teacher']) == 1
    assert f"{src} has no entry 'teacher'; its entries: ['epoch', 'student']" in \
        capsys.readouterr().err
