"""Block-rank analysis on tiny random-init backbones and the rank_analysis tool end to end."""
import csv
import os.path as osp
import sys

import pytest
import torch
from mmpretrain.registry import MODELS

from mmdinomamba.analysis.rank import AS_USED, CAUSAL
from mmdinomamba.analysis.rank_model import analyze_layer, capture_mixer_inputs, mixer_views
from mmdinomamba.analysis.rank_report import aggregate, format_table, hierarchy_lines

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TINY = {
    'ViT': dict(type='ViT', arch=dict(embed_dims=32, num_layers=2, num_heads=2), img_size=32),
    'LinearViT': dict(type='LinearViT', arch=dict(embed_dims=32, num_layers=2, num_heads=4),
                      img_size=32),
    'DinoVim': dict(type='DinoVim', arch=dict(embed_dims=32, num_layers=2), img_size=32,
                    mixer_cfg=dict(d_state=4, headdim=16), residual_in_fp32=False),
}


def _analyze(name, img=(64, 64), block_size=4):
    """Records of layer 1 of a tiny model on one random image (patches 16: 4x4 = 16 tokens)."""
    model = MODELS.build(TINY[name]).double().eval()
    mixer = model.layers[1].mixer
    x = torch.randn(1, 3, *img, dtype=torch.float64)
    with torch.no_grad(), capture_mixer_inputs({1: mixer}) as seen:
        out = model.forward_layers(x, layers=[1])
        recs, spectra = analyze_layer(mixer, *seen[1], out['layout'].patch_index,
                                      range(mixer.num_heads), block_size=block_size,
                                      meta=dict(model=name, layer=1))
    return mixer, seen[1][0], recs, spectra


def test_capture_matches_forward_layers_mixing():
    model = MODELS.build(TINY['ViT']).double().eval()
    x = torch.randn(2, 3, 32, 48, dtype=torch.float64)
    mixers = {0: model.layers[0].mixer, 1: model.layers[1].mixer}
    with torch.no_grad(), capture_mixer_inputs(mixers) as seen:
        out = model.forward_layers(x, with_mixing=True)
    for i in (0, 1):
        m = mixers[i].mixing_matrix(*seen[i])
        torch.testing.assert_close(m, out['mixing'][i])
    assert not mixers[0]._forward_pre_hooks  # hooks removed


def test_ssd_views_structure_and_bounds():
    mixer, x, recs, spectra = _analyze('DinoVim')
    views = mixer_views(mixer, x, None)
    m_used, m_fwd = views[('M', AS_USED)], views[('M', CAUSAL)]
    torch.testing.assert_close(m_used, mixer.mixing_matrix(x))
    torch.testing.assert_close(m_fwd, torch.tril(m_fwd))
    torch.testing.assert_close(torch.tril(m_used, -1), torch.tril(m_fwd, -1) / 2)
    lm = views[('L_M', CAUSAL)]
    ones = torch.ones(1, mixer.num_heads, x.shape[1], dtype=lm.dtype)
    torch.testing.assert_close(torch.diagonal(lm, dim1=-2, dim2=-1), ones)
    lm_used = views[('L_M', AS_USED)]
    assert (lm_used > 0).all()  # both directions: every entry is a positive decay
    keys = {(r['matrix'], r['view']) for r in recs}
    assert keys == {('M', AS_USED), ('M', CAUSAL), ('L_M', AS_USED), ('L_M', CAUSAL)}
    for r in recs:
        if r['matrix'] == 'L_M' and r['block'] != 'diag':
            assert r['rank'] <= 1 and r['bound'] == 1  # scalar decay: rank(L_M^off) = 1
        if r['matrix'] == 'M' and r['block'] != 'diag':
            assert r['rank'] <= r['bound'] <= 4  # Eq. 16: rank(L_M^off) * N, N = 4 = C
    assert {r['block'] for r in recs if r['view'] == CAUSAL} == {'diag', 'lower'}
    assert spectra[('M', CAUSAL)].shape == (1, mixer.num_heads, 4)


def test_patch_tokens_only_and_linear_bound():
    mixer, x, recs, _ = _analyze('LinearViT', block_size=4)
    assert x.shape[1] == 17  # 16 patches + cls; the cls row/column is dropped
    d_qk = mixer.head_dims  # 8 > C = 4: bound is C
    off = [r for r in recs if r['matrix'] == 'M' and r['block'] != 'diag']
    assert all(r['bound'] == min(4, d_qk) and r['rank'] <= r['bound'] for r in off)
    assert all(r['d_qk'] == d_qk and r['C'] == 4 and r['dropped'] == 0 for r in recs)


def test_linear_attention_rank_capped_by_d_qk_on_model():
    model = MODELS.build(dict(TINY['LinearViT'], arch=dict(embed_dims=16, num_layers=2,
                                                           num_heads=4))).double().eval()
    mixer = model.layers[1].mixer  # d_qk = 4 < C = 8
    with torch.no_grad(), capture_mixer_inputs({1: mixer}) as seen:
        out = model.forward_layers(torch.randn(1, 3, 64, 64, dtype=torch.float64), layers=[1])
        recs, _ = analyze_layer(mixer, *seen[1], out['layout'].patch_index, [0, 3],
                                block_size=8)
    assert {r['rank'] for r in recs if r['view'] == AS_USED} == {4}  # every block, diag too
    assert {r['rank'] for r in recs if r['view'] == CAUSAL and r['block'] == 'lower'} == {4}


def test_aggregate_table_and_hierarchy():
    recs = []
    for name in ('ViT', 'LinearViT', 'DinoVim'):
        recs += _analyze(name, block_size=4)[2]
    table = aggregate(recs)
    row = next(r for r in table if r['model'] == 'LinearViT' and r['view'] == CAUSAL
               and r['block'] == 'lower')
    vals = [r['rank'] for r in recs if r['model'] == 'LinearViT' and r['view'] == CAUSAL
            and r['block'] == 'lower' and r['matrix'] == 'M']
    assert row['n'] == len(vals) and row['rank_mean'] == pytest.approx(sum(vals) / len(vals))
    assert row['rank_min'] == min(vals) and row['rank_max'] == max(vals)
    text = format_table(table)
    assert CAUSAL in text and AS_USED in text and 'DinoVim' in text
    lines = hierarchy_lines(table, 4)
    assert any(line.strip().startswith('bounds: C = 4') for line in lines)


def test_rank_analysis_tool_end_to_end(tmp_path):
    sys.path.insert(0, osp.join(ROOT, 'tools', 'analysis'))
    import rank_analysis
    cfg = tmp_path / 'tiny_dinovim.py'
    cfg.write_text(f'model = dict(type="ImageClassifier", backbone={TINY["DinoVim"]!r})\n')
    out = tmp_path / 'out'
    table = rank_analysis.main([str(cfg), '--random-init', '--img-size', '64', '--num-images',
                                '1', '--block-size', '8', '--layers', 'all', '--out-dir',
                                str(out)])
    assert {r['layer'] for r in table} == {0, 1}
    for f in ('rank_blocks.csv', 'rank_summary.csv', 'rank_per_layer.png',
              'offdiag_spectra.png'):
        assert (out / f).stat().st_size > 0
    with open(out / 'rank_summary.csv') as f:
        rows = list(csv.DictReader(f))
    assert {r['view'] for r in rows} == {CAUSAL, AS_USED}
    assert {r['matrix'] for r in rows} == {'M', 'L_M'}
    with pytest.raises(ValueError, match='give --checkpoint or --random-init'):
        rank_analysis.main([str(cfg), '--img-size', '64', '--out-dir', str(out)])
    with pytest.raises(ValueError, match='neither a preset'):
        rank_analysis.main(['nonexistent.py', '--random-init', '--out-dir', str(out)])
    with pytest.raises(ValueError, match='--layers: 5 out of range'):
        rank_analysis.main([str(cfg), '--random-init', '--img-size', '64', '--layers', '5',
                            '--out-dir', str(out)])
