"""EmbeddedShapesSeg / EmbeddedShapesCoco: layout, classes, and mmseg / mmdet metrics that
score the ground truth itself as perfect (checks the label and category conversions)."""
import numpy as np
import pytest
import torch
from mmengine.registry import init_default_scope
from PIL import Image

from mmdinomamba.datasets.embedded_gen import CLASSES
from mmdinomamba.downstream import EmbeddedShapesCoco, EmbeddedShapesSeg


def test_seg_dataset_layout_and_labels(embedded_kwargs):
    init_default_scope('mmseg')
    ds = EmbeddedShapesSeg(split='val', pipeline=[dict(type='LoadAnnotations')],
                           **embedded_kwargs)
    assert len(ds) == 16
    assert ds.metainfo['classes'] == ('background', ) + CLASSES
    assert not ds.reduce_zero_label
    info = ds.get_data_info(3)
    assert '/seg/images/validation/' in info['img_path']
    gt = ds[3]['gt_seg_map']
    ref = np.asarray(Image.open(info['seg_map_path']))
    np.testing.assert_array_equal(gt, ref)  # 0 stays background, k + 1 stays class k
    assert gt.max() <= len(CLASSES) and (gt == 0).any() and (gt > 0).any()


def test_seg_metric_scores_ground_truth_as_perfect(embedded_kwargs):
    init_default_scope('mmseg')
    from mmseg.evaluation import IoUMetric
    from mmseg.structures import SegDataSample
    from mmengine.structures import PixelData
    ds = EmbeddedShapesSeg(split='val', pipeline=[dict(type='LoadAnnotations')],
                           **embedded_kwargs)
    metric = IoUMetric(iou_metrics=['mIoU'])
    metric.dataset_meta = ds.metainfo
    samples = []
    for i in range(len(ds)):
        gt = torch.from_numpy(ds[i]['gt_seg_map']).long()[None]
        s = SegDataSample()
        s.gt_sem_seg, s.pred_sem_seg = PixelData(data=gt), PixelData(data=gt)
        samples.append(s.to_dict())
    metric.process([], samples)
    assert metric.evaluate(len(ds))['mIoU'] == pytest.approx(100.0)


def test_coco_dataset_and_metric_on_ground_truth(embedded_kwargs):
    init_default_scope('mmdet')
    from mmdet.evaluation import CocoMetric
    # LoadImageFromFile sets ori_shape, which mmdet's mask loading needs
    pipeline = [dict(type='LoadImageFromFile'),
                dict(type='LoadAnnotations', with_bbox=True, with_mask=True)]
    ds = EmbeddedShapesCoco(split='val', test_mode=True, pipeline=pipeline, **embedded_kwargs)
    assert len(ds) == 16 and ds.metainfo['classes'] == CLASSES
    metric = CocoMetric(ann_file=f"{embedded_kwargs['data_root']}/coco/annotations/"
                        'instances_val.json', metric=['bbox', 'segm'])
    metric.dataset_meta = ds.metainfo
    samples = []
    for i in range(len(ds)):
        item, info = ds[i], ds.get_data_info(i)
        h, w = info['height'], info['width']
        labels = torch.as_tensor(item['gt_bboxes_labels']).long()
        samples.append(dict(
            img_id=info['img_id'], ori_shape=(h, w),
            pred_instances=dict(bboxes=torch.as_tensor(item['gt_bboxes'].tensor),
                                labels=labels, scores=torch.ones(len(labels)),
                                masks=torch.from_numpy(item['gt_masks'].to_ndarray()).bool())))
    assert sum(len(s['pred_instances']['labels']) for s in samples) >= 16
    metric.process([], samples)
    res = metric.evaluate(len(ds))
    assert res['coco/bbox_mAP'] == pytest.approx(1.0)
    assert res['coco/segm_mAP'] == pytest.approx(1.0)


@pytest.mark.parametrize('cls', [EmbeddedShapesSeg, EmbeddedShapesCoco])
def test_bad_arguments(cls, embedded_kwargs, tmp_path):
    with pytest.raises(ValueError, match="split must be 'train' or 'val'"):
        cls(split='test', **embedded_kwargs)
    with pytest.raises(ValueError, match='ann_file'):
        cls(split='val', ann_file='x.json', **embedded_kwargs)
    with pytest.raises(FileNotFoundError, match='meta.json'):
        cls(data_root=str(tmp_path / 'missing'), generate=False)


def test_seg_rejects_reduce_zero_label(embedded_kwargs):
    with pytest.raises(ValueError, match='reduce_zero_label'):
        EmbeddedShapesSeg(split='val', reduce_zero_label=True, **embedded_kwargs)


@pytest.mark.parametrize('cls', [EmbeddedShapesSeg, EmbeddedShapesCoco])
def test_existing_sizes_are_read_not_defaulted(cls, embedded_root):
    """The test data set (48 / 16 images) is used as it is when no sizes are given, and a
    requested size that differs is an error naming both values (the set is not replaced)."""
    from mmdinomamba.datasets.embedded import EmbeddedDataMismatchError, _read_meta
    meta = (embedded_root / 'meta.json').stat().st_mtime_ns
    ds = cls(data_root=str(embedded_root), split='val')
    assert len(ds) == 16
    with pytest.raises(EmbeddedDataMismatchError, match=r'num_val: existing 16, requested 480'):
        cls(data_root=str(embedded_root), split='val', num_val=480)
    assert (embedded_root / 'meta.json').stat().st_mtime_ns == meta
    assert _read_meta(str(embedded_root))['num_train'] == 48
