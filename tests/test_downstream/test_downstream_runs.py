"""End to end through tools/train.py and tools/test.py: the demo seg / det configs (tiny
backbone, the small test data set) train 2 iterations, then mmseg's IoUMetric and mmdet's CocoMetric
report numbers."""
import math
import os.path as osp

import pytest
from repo_files import load_file



def _tool(name):
    return load_file(f'tools/{name}.py')


def _run(cfg, tmp_path):
    cfg.train_cfg.update(max_iters=2, val_interval=2)
    cfg.default_hooks.update(logger=dict(type='LoggerHook', interval=1),
                             checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=2))
    cfg.val_dataloader = cfg.test_dataloader  # identical in the demo configs
    path = str(tmp_path / 'cfg.py')
    cfg.dump(path)
    work = str(tmp_path / 'work')
    _tool('train').main([path, '--work-dir', work])
    assert osp.isfile(osp.join(work, 'iter_2.pth'))
    return _tool('test').main([path, osp.join(work, 'iter_2.pth'), '--work-dir', work])


@pytest.mark.slow
def test_seg_demo_trains_and_reports_miou(seg_cfg, tmp_path):
    metrics = _run(seg_cfg, tmp_path)
    assert 0 <= metrics['mIoU'] <= 100 and math.isfinite(metrics['aAcc'])


@pytest.mark.slow
def test_det_demo_trains_and_reports_box_and_mask_ap(det_cfg, tmp_path):
    det_cfg.log_processor = dict(by_epoch=False)
    # after 2 iterations no class score passes mmdet's 0.05; keep every box so that the COCO
    # evaluator has results (an empty result list makes CocoMetric return no metrics)
    det_cfg.model.test_cfg.rcnn.score_thr = 0.0
    metrics = _run(det_cfg, tmp_path)
    for key in ('coco/bbox_mAP', 'coco/segm_mAP', 'coco/bbox_mAP_50'):
        assert -1 <= metrics[key] <= 1, (key, metrics[key])
