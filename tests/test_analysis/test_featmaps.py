"""CLS-to-patch feature maps, PCA and plots (fake contract backbone + the real backbones)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmdinomamba.analysis import compute_featmaps, pca_rgb, principal_components, query_tokens
from repo_files import load_file

fake = load_file('tests/test_evaluation/fake_backbone.py')


def _capture_mixer_inputs(backbone):
    """Forward hooks that record each mixer's input (= norm1 output)."""
    seen = {}
    for i, layer in enumerate(backbone.layers):
        layer.mixer.register_forward_hook(
            lambda mod, args, out, i=i: seen.__setitem__(i, args[0].detach()))
    return seen


def test_cls_row_equals_direct_attention():
    bb = fake.FakeBackbone(embed_dims=16, num_heads=2, num_layers=3).eval()
    x = torch.randn(2, 3, 32, 40)
    seen = _capture_mixer_inputs(bb)
    fm = compute_featmaps(bb, x, layers=[0, -1], map_type='mixing', normalize=False)
    assert fm.maps.shape == (2, 2, 2, 1, 4, 5) and fm.layers == [0, 2]
    assert fm.query_index == [0]
    for j, layer_id in enumerate(fm.layers):
        mixer = bb.layers[layer_id].mixer
        q, k, _ = mixer.qkv(seen[layer_id]).reshape(2, 21, 3, 2, 8).permute(2, 0, 3, 1, 4)
        attn = torch.softmax(q[:, :, :1] @ k.transpose(-1, -2) / 8**0.5, dim=-1)  # cls query
        direct = attn[:, :, 0, 1:].reshape(2, 2, 4, 5)
        assert torch.allclose(fm.maps[:, j, :, 0], direct, atol=1e-6)
        # softmax rows: patch weights + the cls self-weight sum to one
        total = fm.maps[:, j, :, 0].sum((-1, -2)) + attn[:, :, 0, 0]
        assert torch.allclose(total, torch.ones_like(total), atol=1e-5)


def test_normalized_maps_and_head_mean():
    bb = fake.FakeBackbone(cls='middle').eval()
    x = torch.randn(3, 3, 32, 32)
    raw = compute_featmaps(bb, x, layers=None, normalize=False).maps
    fm = compute_featmaps(bb, x, layers=None)
    assert fm.maps.shape == (3, 2, 2, 1, 4, 4) and fm.query_index == [8]
    flat = fm.maps.flatten(-2)
    assert torch.allclose(flat.amin(-1), torch.zeros(1))
    assert torch.allclose(flat.amax(-1), torch.ones(1))
    mean = compute_featmaps(bb, x, layers=None, head_reduce='mean').maps
    ref = raw.mean(2, keepdim=True)
    lo, hi = ref.amin((-1, -2), keepdim=True), ref.amax((-1, -2), keepdim=True)
    assert mean.shape[2] == 1 and torch.allclose(mean, (ref - lo) / (hi - lo), atol=1e-6)


def test_registers_are_queries():
    bb = fake.FakeBackbone(cls=None, num_registers=3).eval()
    fm = compute_featmaps(bb, torch.randn(1, 3, 32, 32), map_type='mixing', normalize=False)
    layout = bb.token_layout((4, 4))
    assert fm.maps.shape == (1, 1, 2, 3, 4, 4) and fm.query_index == layout.register_index.tolist()
    with pytest.raises(ValueError, match='no cls token'):
        query_tokens(layout, 'cls')
    with pytest.raises(ValueError, match='no register'):
        query_tokens(fake.FakeBackbone().token_layout((4, 4)), 'registers')


def test_cosine_maps_match_direct_similarity():
    bb = fake.FakeBackbone(embed_dims=16).eval()
    x = torch.randn(2, 3, 24, 32)
    fm = compute_featmaps(bb, x, layers=[1], map_type='cosine', normalize=False,
                          keep_tokens=True, cosine_heads=2)
    tokens = bb.forward_layers(x, layers=[1])['tokens'][0]
    assert fm.maps.shape == (2, 1, 2, 1, 3, 4)
    for h in range(2):
        ch = slice(8 * h, 8 * h + 8)
        ref = F.cosine_similarity(tokens[:, :1, ch], tokens[:, 1:, ch], dim=-1).reshape(2, 3, 4)
        assert torch.allclose(fm.maps[:, 0, h, 0], ref, atol=1e-6)
    assert torch.equal(fm.patch_tokens[0], tokens[:, 1:])
    with pytest.raises(ValueError, match='does not divide'):
        compute_featmaps(bb, x, map_type='cosine', cosine_heads=3)
    with pytest.raises(ValueError, match='map_type'):
        compute_featmaps(bb, x, map_type='gradcam')
    with pytest.raises(ValueError, match='out of range'):
        compute_featmaps(bb, x, layers=[5])


def test_pca_components_and_rgb():
    from sklearn.decomposition import PCA
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(30, 8, generator=g, dtype=torch.float64) * torch.tensor(
        [5., 3., 2., 1., .5, .4, .3, .2], dtype=torch.float64)
    proj, comps = principal_components(feats, 3)
    ref = PCA(3).fit(feats.numpy())
    assert np.allclose(np.abs(comps.numpy()), np.abs(ref.components_), atol=1e-8)
    assert np.allclose(np.abs(proj.numpy()), np.abs(ref.transform(feats.numpy())), atol=1e-8)
    tokens = torch.randn(2, 12, 8, generator=g)
    tokens[:, :6, 0] += 10  # a "foreground" half along channel 0
    rgb = pca_rgb(tokens, (3, 4))
    assert rgb.shape == (2, 3, 4, 3) and rgb.min() >= 0 and rgb.max() <= 1
    masked = pca_rgb(tokens, (3, 4), bg_threshold=0.5)
    black = (masked.reshape(2, 12, 3) == 0).all(-1)
    assert black.any() and not black.all()


def test_plots_write_pngs(tmp_path):
    from mmdinomamba.analysis import plots
    from mmdinomamba.evaluation import roc_curve
    img = np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    maps = torch.rand(2, 2, 3, 4, 4)
    arr = plots.plot_featmap_grid(img, maps, [3, 4], [1, 5, 9], str(tmp_path / 'grid.png'),
                                  aucs=torch.rand(2, 2, 3))
    fpr, tpr = roc_curve(maps[0, 0, 0].flatten(), torch.rand(16) > 0.5)
    roc = plots.plot_roc([('layer 3', fpr, tpr, 0.7)], str(tmp_path / 'roc.png'))
    pca = plots.plot_pca(img, torch.rand(4, 4, 3), str(tmp_path / 'pca.png'))
    curve = plots.plot_auc_per_layer({'vit': {0: 40., 1: 70.}}, str(tmp_path / 'auc.png'))
    for name, a in (('grid', arr), ('roc', roc), ('pca', pca), ('auc', curve)):
        assert (tmp_path / f'{name}.png').stat().st_size > 1000
        assert a.dtype == np.uint8 and a.ndim == 3 and a.shape[2] == 3 and a.std() > 0
    x = torch.arange(3.).view(3, 1, 1).expand(3, 2, 2)
    assert plots.to_image(x, mean=[10, 20, 30], std=[1, 1, 1]).tolist()[0][0] == [10, 21, 32]
    assert plots.to_image(x, mean=[10, 20, 30], std=[1, 1, 1], bgr=True)[0, 0].tolist() == [
        32, 21, 10]
    over = plots.overlay(img, torch.ones(4, 4))
    assert over.shape == (32, 32, 3) and 0 <= over.min() and over.max() <= 1


REAL = {
    'ViT': dict(arch=dict(embed_dims=32, num_layers=2, num_heads=2)),
    'LinearViT': dict(arch=dict(embed_dims=32, num_layers=2, num_heads=2)),
    'DinoVim': dict(arch=dict(embed_dims=32, num_layers=2), mixer_cfg=dict(d_state=8, headdim=16)),
    'MambaReg': dict(arch=dict(embed_dims=32, num_layers=2), mixer_cfg=dict(d_state=8, headdim=16),
                     num_registers=3),
}


def _real(name):
    from mmpretrain.registry import MODELS

    import mmdinomamba  # noqa: F401  (registration)
    return MODELS.build(dict(type=name, img_size=32, patch_size=8, **REAL[name])).eval()


@pytest.mark.parametrize('name', sorted(REAL))
def test_real_backbone_maps_are_query_rows(name):
    bb = _real(name)
    x = torch.randn(2, 3, 32, 40)
    seen = _capture_mixer_inputs(bb)
    fm = compute_featmaps(bb, x, layers=[0, -1], normalize=False)
    layout = bb.token_layout((4, 5))
    q = query_tokens(layout)
    heads = bb.layers[0].mixer.num_heads
    assert fm.maps.shape == (2, 2, heads, len(q), 4, 5) and fm.query_index == q.tolist()
    for j, layer_id in enumerate(fm.layers):
        m = bb.layers[layer_id].mixer.mixing_matrix(seen[layer_id])  # (B, heads, L, L)
        rows = m[:, :, q][..., layout.patch_index].reshape(2, heads, len(q), 4, 5)
        assert torch.allclose(fm.maps[:, j], rows, atol=1e-6)
        if name in ('ViT', 'LinearViT'):  # non-negative rows summing to one over all tokens
            others = torch.ones(layout.length, dtype=torch.bool)
            others[layout.patch_index] = False
            total = fm.maps[:, j].sum((-1, -2)) + m[:, :, q][..., others].sum(-1)
            assert (fm.maps[:, j] >= 0).all()
            assert torch.allclose(total, torch.ones_like(total), atol=1e-5)
    if name == 'MambaReg':
        assert len(q) == 3 and layout.cls_index is None


def test_vit_map_equals_directly_computed_attention():
    bb = _real('ViT')
    x = torch.randn(2, 3, 32, 32)
    seen = _capture_mixer_inputs(bb)
    fm = compute_featmaps(bb, x, layers=[1], normalize=False)
    mixer = bb.layers[1].mixer
    w_q, w_k, _ = mixer.qkv.weight.chunk(3)
    b_q, b_k, _ = mixer.qkv.bias.chunk(3)
    q = (seen[1] @ w_q.T + b_q).reshape(2, 17, 2, 16).transpose(1, 2)
    k = (seen[1] @ w_k.T + b_k).reshape(2, 17, 2, 16).transpose(1, 2)
    attn = torch.softmax(q[:, :, 0:1] @ k.transpose(-1, -2) / 4, dim=-1)[:, :, 0]  # cls query
    assert torch.allclose(fm.maps[:, 0, :, 0], attn[..., 1:].reshape(2, 2, 4, 4), atol=1e-6)


def test_dinovim_middle_cls_row_covers_both_directions():
    bb = _real('DinoVim')
    x = torch.randn(1, 3, 32, 32)
    seen = _capture_mixer_inputs(bb)
    fm = compute_featmaps(bb, x, layers=[1], normalize=False)
    layout = bb.token_layout((4, 4))
    cls, patch = layout.cls_index, layout.patch_index
    mats = bb.layers[1].mixer.mixing_matrices(seen[1])
    fwd, bwd = mats['forward'][0, :, cls, patch], mats['backward'][0, :, cls, patch]
    before, after = patch < cls, patch > cls
    assert before.sum() == 8 and after.sum() == 8  # middle cls of 16 patches
    assert (fwd[:, after] == 0).all() and (bwd[:, before] == 0).all()  # causal directions
    assert (fwd[:, before] != 0).all() and (bwd[:, after] != 0).all()
    got = fm.maps[0, 0, :, 0].flatten(1)
    assert torch.allclose(got[:, before], fwd[:, before] / 2, atol=1e-6)
    assert torch.allclose(got[:, after], bwd[:, after] / 2, atol=1e-6)
