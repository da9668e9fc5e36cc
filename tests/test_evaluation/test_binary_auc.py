"""Binary-AUC: exact AUC vs sklearn, threshold sweep, normalization, skipping, mask resizing,
registry + Evaluator."""
import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from mmdinomamba.evaluation import BinaryAUC
from mmdinomamba.evaluation.auc import (exact_auc, minmax_normalize, normalize_auc, resize_mask,
                                        roc_curve, sweep_auc, sweep_counts)


def _random(n=64, p=196, levels=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, levels, (n, p), generator=g).double() / (levels - 1)  # many ties
    labels = torch.rand(n, p, generator=g) < torch.rand(n, 1, generator=g).clamp(0.1, 0.9)
    return scores, labels


def test_exact_auc_equals_sklearn_with_ties():
    scores, labels = _random()
    cont = torch.rand(8, 50, dtype=torch.float64)
    ours = torch.cat([exact_auc(scores, labels), exact_auc(cont, labels[:8, :50])])
    ref = [roc_auc_score(y.numpy(), s.numpy()) for s, y in zip(scores, labels)]
    ref += [roc_auc_score(y.numpy(), s.numpy()) for s, y in zip(cont, labels[:8, :50])]
    assert torch.allclose(ours, torch.tensor(ref, dtype=torch.float64), rtol=0, atol=1e-12)


def test_exact_auc_ignores_invalid_pixels():
    scores, labels = _random(n=16, p=100, seed=1)
    valid = torch.rand(16, 100, generator=torch.Generator().manual_seed(2)) > 0.3
    scores_with_junk = torch.where(valid, scores, torch.full_like(scores, 1e6))
    ours = exact_auc(scores_with_junk, labels, valid)
    ref = [roc_auc_score(y[v].numpy(), s[v].numpy()) for s, y, v in zip(scores, labels, valid)]
    assert torch.allclose(ours, torch.tensor(ref, dtype=torch.float64), rtol=0, atol=1e-12)


def _paper_sweep_loop(score, label, k):
    """Eq. 18-20 written out literally for one map (independent reference)."""
    pts = [(1.0, 1.0)]
    for t in np.linspace(0, 1, k):
        on = score >= t
        pts.append(((on & ~label).sum() / (~label).sum(), (on & label).sum() / label.sum()))
    pts.append((0.0, 0.0))
    return sum((f0 - f1) * (t0 + t1) / 2 for (f0, t0), (f1, t1) in zip(pts[:-1], pts[1:]))


def test_sweep_matches_literal_formula_and_converges():
    scores, labels = _random(n=6, p=196, levels=1000, seed=3)
    scores = minmax_normalize(scores, dims=(1, ))
    for k in (5, 21):
        ours = sweep_auc(scores, labels, num_thresholds=k)
        ref = [_paper_sweep_loop(s.numpy(), y.numpy(), k) for s, y in zip(scores, labels)]
        assert torch.allclose(ours, torch.tensor(ref, dtype=torch.float64), atol=1e-12)
    exact = exact_auc(scores, labels)
    errors = [(sweep_auc(scores, labels, num_thresholds=k) - exact).abs().max().item()
              for k in (3, 11, 101, 1001)]
    assert errors[-1] < 1e-12 < 1e-3 < errors[0]  # 1001 thresholds split every level gap


def test_sweep_exact_when_thresholds_hit_every_level():
    scores, labels = _random(n=32, p=64, levels=9, seed=4)  # values k / 8
    exact = exact_auc(scores, labels)
    assert torch.allclose(sweep_auc(scores, labels, num_thresholds=9), exact, atol=1e-12)
    assert not torch.allclose(sweep_auc(scores, labels, num_thresholds=3), exact, atol=1e-6)
    t, tpr, fpr = sweep_counts(scores, labels, num_thresholds=9)
    assert torch.all(tpr[:, 0] == 1) and torch.all(fpr[:, 0] == 1)  # t = 0: all activated
    assert torch.all(tpr[:, 1:] <= tpr[:, :-1])


def test_normalization_and_roc_curve():
    score = torch.linspace(0, 1, 10)[None].double()
    label = score > 0.5
    assert exact_auc(score, label).item() == 1.0
    inverted = exact_auc(1 - score, label)
    assert inverted.item() == 0.0 and normalize_auc(inverted).item() == 1.0
    res = BinaryAUC.calculate(torch.tensor([[0.2, 0.9, 0.4, 0.1]]), torch.tensor([[1, 0, 0, 0]]))
    assert res['auc'].item() == pytest.approx(1 / 3)  # 0.2 beats only 0.1
    assert res['auc_norm'].item() == pytest.approx(2 / 3)
    res = BinaryAUC.calculate(torch.tensor([[0.2, 0.9, 0.4, 0.1]]), torch.tensor([[0, 1, 1, 0]]))
    assert res['auc'].item() == 1.0
    s, y = _random(n=1, p=40, seed=5)
    fpr, tpr = roc_curve(s[0], y[0])
    assert fpr[0] == 0 and tpr[0] == 0 and fpr[-1] == 1 and tpr[-1] == 1
    assert torch.trapezoid(tpr, fpr).item() == pytest.approx(exact_auc(s, y).item(), abs=1e-12)


def test_degenerate_masks_are_skipped():
    maps = torch.rand(3, 4, 4)
    masks = torch.stack([torch.ones(4, 4), torch.zeros(4, 4), torch.eye(4)]).bool()
    for k in (None, 11):
        res = BinaryAUC.calculate(maps, masks, num_thresholds=k)
        assert res['skipped'].tolist() == [True, True, False]
        assert torch.isnan(res['auc'][:2]).all() and not torch.isnan(res['auc'][2])


def _area_reference(mask, h, w, min_valid=0.5):
    """Loop over adaptive-pool windows: start = floor(i H / h), end = ceil((i + 1) H / h)."""
    big_h, big_w = mask.shape
    fg = np.zeros((h, w), bool)
    valid = np.zeros((h, w), bool)
    for i in range(h):
        for j in range(w):
            win = mask[i * big_h // h:-(-(i + 1) * big_h // h),
                       j * big_w // w:-(-(j + 1) * big_w // w)]
            ok = win != 255
            valid[i, j] = ok.mean() >= min_valid
            fg[i, j] = valid[i, j] and (win[ok] == 1).mean() >= 0.5
    return fg, valid


@pytest.mark.parametrize('size', [(224, 224), (225, 300), (97, 61), (14, 14), (500, 375)])
def test_resize_mask_to_14x14(size):
    rng = np.random.default_rng(sum(size))
    mask = (rng.random(size) < 0.4).astype(np.uint8)
    mask[rng.random(size) < 0.1] = 255
    fg, valid = resize_mask(torch.from_numpy(mask), (14, 14))
    ref_fg, ref_valid = _area_reference(mask, 14, 14)
    assert fg.shape == (14, 14) and fg.dtype == torch.bool
    assert np.array_equal(fg.numpy(), ref_fg) and np.array_equal(valid.numpy(), ref_valid)
    near_fg, near_valid = resize_mask(torch.from_numpy(mask), (14, 14), mode='nearest')
    rows = (np.arange(14) * size[0]) // 14
    cols = (np.arange(14) * size[1]) // 14
    sampled = mask[rows][:, cols]
    assert np.array_equal(near_fg.numpy(), sampled == 1)
    assert np.array_equal(near_valid.numpy(), sampled != 255)


def test_resize_mask_geometry():
    mask = np.zeros((224, 224), np.uint8)
    mask[:, :112] = 1
    fg, valid = resize_mask(torch.from_numpy(mask), (14, 14))
    assert fg[:, :7].all() and not fg[:, 7:].any() and valid.all()
    mask[:, 200:] = 255  # the last 1.5 patch columns are ignored
    fg, valid = resize_mask(torch.from_numpy(mask), (14, 14))
    assert valid[:, :13].all() and not valid[:, 13].any()  # patch 12: half valid
    with pytest.raises(ValueError, match='bicubic'):
        resize_mask(torch.from_numpy(mask), (14, 14), mode='bicubic')


def _sample(maps, seg, layers):
    from mmpretrain.structures import DataSample
    ds = DataSample()
    ds.set_field(maps, 'pred_featmap')
    ds.set_field(seg, 'gt_seg_map')
    ds.set_metainfo(dict(featmap_layers=layers))
    return ds


def test_metric_through_registry_and_evaluator():
    from mmengine.evaluator import Evaluator
    from mmpretrain.registry import METRICS
    assert isinstance(METRICS.build(dict(type='BinaryAUC')), BinaryAUC)
    g = torch.Generator().manual_seed(0)
    samples, expected = [], []
    for n in range(5):
        maps = torch.rand(2, 3, 1, 4, 4, generator=g)  # 2 layers x 3 heads
        seg = (torch.rand(32, 32, generator=g) > 0.5).to(torch.uint8)
        if n == 4:
            seg[:] = 1  # all foreground -> skipped
        fg, _ = resize_mask(seg, (4, 4))
        if n < 4:
            expected.append([[roc_auc_score(fg.flatten().numpy(), maps[i, h, 0].flatten().numpy())
                              for h in range(3)] for i in range(2)])
        samples.append(_sample(maps, seg.numpy(), [10, 11]))
    evaluator = Evaluator([dict(type='mmpretrain.BinaryAUC', layer_head=True)])
    evaluator.process(samples[:3])
    evaluator.process(samples[3:])
    metrics = evaluator.evaluate(5)
    exp = np.array(expected) * 100
    assert metrics['binary_auc/num_images'] == 5 and metrics['binary_auc/skipped'] == 1
    assert metrics['binary_auc/auc'] == pytest.approx(exp.mean(), abs=1e-9)
    assert metrics['binary_auc/auc_norm'] == pytest.approx(np.maximum(exp, 100 - exp).mean())
    assert metrics['binary_auc/auc/layer_11'] == pytest.approx(exp[:, 1].mean())
    assert metrics['binary_auc/auc/head_2'] == pytest.approx(exp[:, :, 2].mean())
    assert metrics['binary_auc/auc/layer_10_head_1'] == pytest.approx(exp[:, 0, 1].mean())
    assert 'binary_auc/auc/reg_0' not in metrics


def test_metric_register_breakdown_and_errors():
    metric = BinaryAUC(num_thresholds=101)
    maps = torch.rand(1, 1, 3, 4, 4)
    seg = np.zeros((16, 16), np.uint8)
    seg[:8] = 1
    metric.process(None, [_sample(maps, seg, [5]).to_dict()])
    res = metric.compute_metrics(metric.results)
    assert {'auc/reg_0', 'auc/reg_2', 'auc_norm/reg_1'} <= set(res)
    with pytest.raises(KeyError, match='pred_featmap'):
        metric.process(None, [dict(gt_seg_map=seg)])
    with pytest.raises(ValueError, match='num_thresholds'):
        BinaryAUC(num_thresholds=1)
