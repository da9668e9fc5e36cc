"""The demo report reads what the tools write and says what the numbers show."""
import math

from mmdinomamba.utils.demo_report import (auc_by_layer, probe_accuracy, summarize_curve,
                                           write_report)


def test_summarize_curve_falling_rising_and_nonfinite():
    s = summarize_curve([5.0, 4.0, 3.0, 2.0, 1.0, 0.5], window=2)
    assert s['first'] == 4.5 and s['last'] == 0.75 and s['fell'] and s['finite']
    assert s['min'] == 0.5 and s['max'] == 5.0 and s['n'] == 6
    assert not summarize_curve([1.0, 2.0], window=1)['fell']
    assert not summarize_curve([1.0, float('nan')])['finite']
    assert summarize_curve([]) is None


def test_auc_by_layer_parses_prefixed_keys_and_sorts():
    metrics = {'binary-auc/auc': 60.0, 'binary-auc/auc/layer_3': 70.0,
               'binary-auc/auc/layer_0': 55.0, 'binary-auc/auc_norm/layer_0': 58.0,
               'binary-auc/auc/head_1': 1.0}
    assert auc_by_layer(metrics) == {0: 55.0, 3: 70.0}
    assert list(auc_by_layer(metrics)) == [0, 3]
    assert auc_by_layer(metrics, 'auc_norm') == {0: 58.0}


def test_probe_accuracy_last_and_best():
    rows = [{'loss': 1.0, 'step': 1}, {'accuracy/top1': 40.0, 'step': 1},
            {'accuracy/top1': 75.0, 'step': 2}, {'accuracy/top1': 70.0, 'step': 3}]
    assert probe_accuracy(rows) == dict(last=70.0, best=75.0, evaluations=3)
    assert probe_accuracy([{'loss': 1.0}]) is None


def test_write_report_contains_numbers(tmp_path):
    scalars = [dict(loss=9.0 - i, teacher_entropy=3.0, iter=i) for i in range(8)]
    aucs = {'teacher': {'binary-auc/auc': 80.0, 'binary-auc/auc/layer_0': 75.0,
                        'binary-auc/auc_norm/layer_0': 76.0},
            'random': {'binary-auc/auc': 50.0, 'binary-auc/auc/layer_0': 51.0}}
    probes = {'teacher': [{'accuracy/top1': 90.0}], 'random': []}
    text = write_report(str(tmp_path), 'cfg.py', scalars, aucs, probes, times={'a': 1.0},
                        total=2.0)
    assert (tmp_path / 'report.md').read_text() == text
    assert 'The loss fell' in text and '| teacher_entropy | 8 |' in text
    assert '| 0 | 75.0 | 76.0 | 51.0 | - |' in text
    assert '| teacher | 90.00 | 90.00 | 1 |' in text and '| random | - | - | 0 |' in text
    assert not math.isnan(summarize_curve([s['loss'] for s in scalars])['last'])
