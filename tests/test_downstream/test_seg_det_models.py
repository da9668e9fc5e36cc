"""Tiny DinoVim + UperNet and tiny DinoVim + Cascade Mask R-CNN on the embedded data: one
training iteration (finite losses, backbone updated), predictions for a non-square input."""
import math

import torch
from mmengine.dataset import pseudo_collate
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope


def _train_once(model, cfg, registry):
    dataset = registry.build(cfg.train_dataloader.dataset)
    data = pseudo_collate([dataset[i] for i in range(2)])  # batch 2: BatchNorm in the PPM
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    before = {n: p.detach().clone() for n, p in model.backbone.named_parameters()}
    model.train()
    log_vars = model.train_step(data, optim)
    assert all(math.isfinite(float(v)) for v in log_vars.values()), log_vars
    changed = [n for n, p in model.backbone.named_parameters() if not torch.equal(before[n], p)]
    assert 'patch_embed.proj.weight' in changed and any('layers.1.mixer' in n for n in changed)
    return log_vars


def _image(h=64, w=96):
    return torch.randint(0, 256, (3, h, w), dtype=torch.uint8)


def test_upernet_tiny_dinovim_train_step_and_nonsquare_predict(seg_cfg):
    init_default_scope('mmseg')
    from mmseg.registry import DATASETS, MODELS
    from mmseg.structures import SegDataSample
    seg_cfg.train_dataloader.dataset.pipeline = [
        dict(type='LoadImageFromFile'), dict(type='LoadAnnotations'),
        dict(type='Resize', scale=(96, 64), keep_ratio=False), dict(type='PackSegInputs')]
    seg_cfg.model.data_preprocessor.size = (64, 96)
    model = MODELS.build(seg_cfg.model)
    model.init_weights()
    log_vars = _train_once(model, seg_cfg, DATASETS)
    assert {'decode.loss_ce', 'aux.loss_ce', 'loss'} <= set(log_vars)
    model.eval()
    meta = dict(img_shape=(64, 96), ori_shape=(32, 48), pad_shape=(64, 96))
    with torch.no_grad():
        out = model.test_step(dict(inputs=[_image()], data_samples=[SegDataSample(metainfo=meta)]))
    assert out[0].seg_logits.data.shape == (7, 32, 48)
    pred = out[0].pred_sem_seg.data
    assert pred.shape == (1, 32, 48) and 0 <= pred.min() and pred.max() < 7


def test_cascade_mask_rcnn_tiny_dinovim_train_step_and_nonsquare_predict(det_cfg):
    init_default_scope('mmdet')
    from mmdet.registry import DATASETS, MODELS
    from mmdet.structures import DetDataSample
    det_cfg.train_dataloader.dataset.pipeline = [
        dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', with_bbox=True,
                                             with_mask=True),
        dict(type='Resize', scale=(96, 64), keep_ratio=False), dict(type='PackDetInputs')]
    model = MODELS.build(det_cfg.model)
    model.init_weights()
    log_vars = _train_once(model, det_cfg, DATASETS)
    for key in ('loss_rpn_cls', 'loss_rpn_bbox', 's0.loss_cls', 's2.loss_bbox', 's2.loss_mask'):
        assert key in log_vars
    model.eval()
    meta = dict(img_shape=(64, 96), ori_shape=(32, 48), scale_factor=(2.0, 2.0))
    with torch.no_grad():
        out = model.test_step(dict(inputs=[_image()], data_samples=[DetDataSample(metainfo=meta)]))
    pred = out[0].pred_instances
    n = len(pred)
    assert pred.bboxes.shape == (n, 4) and pred.masks.shape == (n, 32, 48)
    assert n == 0 or (pred.bboxes[:, 0::2].max() <= 48 and pred.bboxes[:, 1::2].max() <= 32)
    assert n == 0 or int(pred.labels.max()) < 6
