"""RestrictedAccuracy (200-class restriction of a 1000-way head) and ReaLAccuracy."""
import math

import pytest
import torch
from mmengine.registry import init_default_scope
from mmpretrain.registry import METRICS

from mmdinomamba.datasets.imagenet_variants import subset_indices
from mmdinomamba.evaluation import ReaLAccuracy, restrict_predictions


def _evaluate(metric, samples):
    metric.process(None, samples)
    return metric.evaluate(len(samples))


def test_restrict_predictions_against_a_loop():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(20, 1000, generator=g)
    idx = subset_indices('imagenet-r')
    got = restrict_predictions(scores, idx, k=3)
    for row, pred in zip(scores, got):
        best = sorted(idx, key=lambda c: -row[c].item())[:3]
        assert pred.tolist() == best


def test_restriction_ignores_classes_outside_the_subset():
    idx = subset_indices('imagenet-a')  # 6 (n01498041) is the first A class, 0 is not in A
    scores = torch.zeros(2, 1000)
    scores[:, 0] = 10.  # global arg-max outside the subset
    scores[0, idx[5]] = 1.
    scores[1, idx[199]] = 2.
    scores[1, idx[3]] = 1.
    assert restrict_predictions(scores, idx).flatten().tolist() == [idx[5], idx[199]]
    assert restrict_predictions(scores, idx, k=2)[1].tolist() == [idx[199], idx[3]]


def test_restricted_accuracy_metric_through_the_registry():
    init_default_scope('mmpretrain')
    idx = subset_indices('imagenet-a')
    metric = METRICS.build(dict(type='RestrictedAccuracy', subset='imagenet-a', topk=(1, 2)))
    samples = []
    for gt, (first, second) in zip([idx[0], idx[1], idx[2], idx[3]],
                                   [(idx[0], idx[9]), (idx[9], idx[1]), (idx[7], idx[8]),
                                    (0, idx[3])]):
        score = torch.zeros(1000)
        score[first], score[second] = 2., 1.
        samples.append(dict(pred_score=score, gt_label=torch.tensor([gt])))
    # top-1: sample 0 right; sample 3's global best (0) is outside A -> its A best idx[3] right
    res = _evaluate(metric, samples)
    assert res == {'restricted/top1': 50., 'restricted/top2': 75.}
    metric = METRICS.build(dict(type='RestrictedAccuracy', subset='imagenet-a'))
    with pytest.raises(ValueError, match='not in the subset'):
        _evaluate(metric, [dict(pred_score=torch.zeros(1000), gt_label=torch.tensor([0]))])


def test_real_accuracy_with_no_one_or_several_labels():
    preds = [3, 3, 5, 1, 7]
    reals = [[3], [1, 3, 9], [], [2], []]
    acc, used = ReaLAccuracy.calculate(preds, reals)
    assert used == 3 and acc == pytest.approx(200. / 3)
    acc, used = ReaLAccuracy.calculate([1], [[]])
    assert used == 0 and math.isnan(acc)
    with pytest.raises(ValueError, match='2 predictions but 1'):
        ReaLAccuracy.calculate([1, 2], [[1]])


def test_real_accuracy_metric_through_the_registry():
    init_default_scope('mmpretrain')
    metric = METRICS.build(dict(type='ReaLAccuracy'))
    samples = []
    for pred, real in ((4, [4]), (4, [1, 4]), (2, [1, 3]), (0, [])):
        score = torch.zeros(10)
        score[pred] = 1.
        samples.append(dict(pred_score=score, real_labels=real, gt_label=torch.tensor([1])))
    res = _evaluate(metric, samples)
    assert res == {'real/top1': pytest.approx(200. / 3), 'real/num_images': 3,
                   'real/num_excluded': 1}
    with pytest.raises(KeyError, match='real_labels'):
        _evaluate(METRICS.build(dict(type='ReaLAccuracy')), [dict(pred_score=torch.zeros(3))])
