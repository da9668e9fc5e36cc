"""The demo's summary and report: pure functions of the measured numbers."""
import math

import pytest

from mmdinomamba.demo.report import (AT_CHANCE, auc_by_layer, auc_during_training,
                                     build_summary, render_report, series)

SUMMARY_KEYS = {'wall_time_s', 'num_classes', 'knn_top1', 'linear_top1', 'binary_auc_mean',
                'binary_auc_best_layer', 'binary_auc_per_layer', 'teacher_batch_entropy',
                'prototypes_used', 'random_vs_chance'}
AUC_KEYS = {'binary_auc_mean', 'binary_auc_best_layer', 'binary_auc_per_layer'}


def _result(knn, lin, layers=None):
    auc = None if layers is None else {f'binary_auc/auc/layer_{i}': v
                                       for i, v in enumerate(layers)}
    if auc is not None:
        auc['binary_auc/auc'] = sum(layers) / len(layers)
    return dict(knn_top1=knn, linear_top1=lin, binary_auc=auc)


SCALARS = [dict(loss=5.0, teacher_batch_entropy=4.0, prototypes_used=12., iter=10, step=10),
           {'binary_auc/auc': 55., 'binary_auc/auc/layer_0': 50., 'binary_auc/auc/layer_1': 60.,
            'step': 50},
           dict(loss=4.0, teacher_batch_entropy=3.5, prototypes_used=20., iter=60, step=60)]


def test_summary_has_the_documented_keys_and_values():
    teacher = _result(70., 80., [60., 70.])
    randoms = [_result(50., 60., [50., 52.]), _result(52., 61., [49., 56.]),
               _result(48., 59., [51., 50.])]
    s = build_summary(teacher, randoms, SCALARS, num_classes=6, out_dim=256, wall_time_s=12.34)
    assert set(s) == SUMMARY_KEYS
    assert s['num_classes'] == 6 and s['wall_time_s'] == 12.3
    assert s['knn_top1'] == dict(teacher=70., random=[50., 52., 48.])
    assert s['binary_auc_mean'] == dict(teacher=65., random=[51., 52.5, 50.5])
    assert s['binary_auc_best_layer'] == dict(teacher=70., random=[52., 56., 51.])
    assert s['teacher_batch_entropy'] == dict(final=3.5, log_k=math.log(256))
    assert s['prototypes_used'] == dict(final=20., k=256)


def test_summary_without_masks_has_no_auc_keys():
    s = build_summary(_result(70., 80.), [_result(50., 60.)], SCALARS, 3, 64, 1.)
    assert set(s) == SUMMARY_KEYS - AUC_KEYS


def test_logged_series_and_auc_during_training():
    assert series(SCALARS, 'loss') == [(10, 5.), (60, 4.)]
    assert auc_during_training(SCALARS) == {50: {0: 50., 1: 60.}}
    assert auc_by_layer({'auc': 61.}) == {-1: 61.}
    assert auc_by_layer(None) == {}


def test_report_states_margins_and_spread():
    teacher = _result(70., 80., [60., 70.])
    randoms = [_result(50., 60., [50., 52.]), _result(54., 62., [49., 56.])]
    s = build_summary(teacher, randoms, SCALARS, 6, 256, 30.)
    text = render_report(s, 'configs/x.py', '/data', ['curves.png'], {'pretrain': 20.})
    assert '| k-NN top-1 (k=20, T=0.07, cls token) | 70.0 | 52.0 ± 2.0 (min 50.0, max 54.0) ' \
           '| +16.0 points |' in text
    assert 'random init (2 seeds)' in text and '![curves.png](curves.png)' in text
    assert '3.50 nats of log K = 5.55' in text and '20.0 of K = 256' in text
    no_masks = render_report(build_summary(_result(1., 2.), [_result(1., 2.)], [], 2, 8, 1.),
                             'c', 'd', [], {})
    assert 'Binary-AUC: skipped' in no_masks and 'prototypes in use' in no_masks


def test_random_init_at_chance_is_measured_and_reported():
    # 5 classes (chance 20%): the best random seed at 20.6 is at chance, 52 would not be
    at = build_summary(_result(22., 25.), [_result(18., 20.), _result(20.6, 21.)], SCALARS, 5,
                       256, 1.)
    assert at['random_vs_chance'] == dict(chance=20., best_random_knn=20.6, ratio=1.03,
                                          at_chance=True)
    text = render_report(at, 'c', 'd', [], {})
    assert 'random init classifies at chance' in text and '1.03 x chance 20.0%' in text
    above = build_summary(_result(70., 80.), [_result(52., 60.)], SCALARS, 5, 256, 1.)
    assert above['random_vs_chance']['at_chance'] is False
    assert 'classifies at chance' not in render_report(above, 'c', 'd', [], {})
    edge = build_summary(_result(1., 2.), [_result(AT_CHANCE * 10., 1.)], SCALARS, 10, 8, 1.)
    assert edge['random_vs_chance']['at_chance'] is False  # at the bar is not below it


@pytest.mark.parametrize('line,expected', [
    ('Epoch(train) [2][ 30/75]  lr: 1e-3  eta: 0:01:02  loss: 5.1234  teacher_entropy: 3.2  '
     'teacher_batch_entropy: 4.5  prototypes_used: 37.0000',
     '[demo] dinovim pretrain 105/600 (18%) | eta 0:01:02 | loss 5.12 | H/image 3.20 | '
     'H/batch 4.50 | prototypes 37'),
    ('some other line', None)])
def test_progress_line(line, expected):
    from repo_files import load_file
    demo = load_file('tools/demo.py')
    assert demo.Progress('dinovim', 8).format(line) == expected


def _with_heads(result, heads):
    result['binary_auc_heads'] = {f'binary_auc/auc/head_{h}': v for h, v in enumerate(heads)}
    return result


def test_supervised_baseline_sits_next_to_teacher_and_random_in_every_metric():
    teacher = _with_heads(_result(70., 80., [60., 70.]), [66., 74.])
    sup = _with_heads(_result(90., 95., [58., 64.]), [60., 68.])
    randoms = [_with_heads(_result(50., 60., [50., 52.]), [50., 54.])]
    s = build_summary(teacher, randoms, SCALARS, 6, 256, 1., supervised=sup)
    for key in ('knn_top1', 'linear_top1', 'binary_auc_mean', 'binary_auc_best_layer',
                'binary_auc_per_layer', 'binary_auc_last_layer_heads'):
        assert set(s[key]) == {'teacher', 'supervised', 'random'}, key
    assert s['knn_top1']['supervised'] == 90. and s['binary_auc_mean']['supervised'] == 61.
    assert s['binary_auc_last_layer_heads'] == dict(
        teacher={'0': 66., '1': 74.}, supervised={'0': 60., '1': 68.},
        random=[{'0': 50., '1': 54.}])
    text = render_report(s, 'c.py', '/d', [], {})
    assert '| DINO teacher | supervised | random init' in text
    assert '- k-NN top-1: supervised above DINO (70.0 vs 90.0, -20.0)' in text
    assert '- Binary-AUC mean over layers: DINO above supervised (65.0 vs 61.0, +4.0)' in text
    assert '| supervised | 58.0 | 64.0 |' in text and '| DINO teacher | 66.0 | 74.0 |' in text
    assert 'supervised' not in build_summary(teacher, randoms, SCALARS, 6, 256, 1.)['knn_top1']


def test_collapse_is_an_entry_of_summary_and_report():
    record = dict(kind='uniform', iteration=28, epoch=1, since_iteration=20,
                  signals=dict(teacher_entropy=5.54, teacher_batch_entropy=5.545,
                               prototypes_used=7.), what_to_change='Try: a lower teacher_temp',
                  checkpoint='/w/collapse_iter_28.pth', message='long')
    s = build_summary(_result(40., 50.), [_result(50., 60.)], SCALARS, 3, 256, 1.,
                      collapse=record)
    assert s['collapse']['kind'] == 'uniform' and s['collapse']['iteration'] == 28
    assert s['collapse']['signals']['prototypes_used'] == 7. and 'message' not in s['collapse']
    text = render_report(s, 'c.py', '/d', [], {})
    assert '**uniform collapse**' in text and 'iteration 28' in text
    assert 'what to change: Try: a lower teacher_temp' in text and 'status 3' in text
    assert 'collapse' not in build_summary(_result(40., 50.), [_result(50., 60.)], SCALARS, 3,
                                           256, 1.)
