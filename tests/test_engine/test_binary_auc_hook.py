"""BinaryAUCHook on a tiny DINO-like model (student + frozen teacher) trained for 2 epochs."""
import json
import os.path as osp
from copy import deepcopy

import pytest
import torch
from mmengine.model import BaseModel
from mmengine.runner import Runner

from mmdinomamba.analysis import compute_featmaps
from mmdinomamba.engine.hooks import BinaryAUCHook
from mmdinomamba.engine.hooks.binary_auc_hook import find_backbone
from mmdinomamba.evaluation import BinaryAUC
from repo_files import load_file

fake = load_file('tests/test_evaluation/fake_backbone.py')


class ToyDINO(BaseModel):
    """Student backbone trained on a dummy loss; teacher = frozen copy of the initial weights."""

    def __init__(self):
        super().__init__(data_preprocessor=dict(type='mmpretrain.ClsDataPreprocessor',
                                                mean=[127.5] * 3, std=[127.5] * 3))
        self.backbone = fake.FakeBackbone(embed_dims=16, num_heads=2, num_layers=2)
        self.teacher = torch.nn.Module()
        self.teacher.backbone = deepcopy(self.backbone).requires_grad_(False)

    def forward(self, inputs, data_samples=None, mode='loss'):
        tokens = self.backbone.forward_layers(inputs, layers=[1])['tokens'][0]
        return dict(loss=tokens[:, 0].pow(2).mean() + 10 * self.backbone.cls_token.sum())


def _loader(root, split, with_mask, batch_size):
    pipeline = [dict(type='LoadImageFromFile')]
    if with_mask:
        pipeline.append(dict(type='LoadFgMask'))
    pipeline.append(dict(type='PackInputs', algorithm_keys=['gt_seg_map']))
    return dict(batch_size=batch_size, num_workers=0,
                sampler=dict(type='DefaultSampler', shuffle=False),
                dataset=dict(type='EmbeddedShapes', data_root=str(root), split=split,
                             with_mask=with_mask, num_train=48, num_val=16, img_size=64,
                             pipeline=pipeline))


def test_hook_evaluates_teacher_and_logs(tmp_path, embedded_root):
    val_loader = _loader(embedded_root, 'val', True, 8)
    runner = Runner(
        model=ToyDINO(), work_dir=str(tmp_path), default_scope='mmpretrain',
        train_dataloader=_loader(embedded_root, 'train', False, 16),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        custom_hooks=[dict(type='BinaryAUCHook', dataloader=val_loader, interval=1,
                           layers=[0, 1], data_preprocessor=dict(
                               type='ClsDataPreprocessor', mean=[127.5] * 3, std=[127.5] * 3),
                           num_examples=2)],
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=100)),
        log_level='WARNING')
    runner.train()
    hook = next(h for h in runner.hooks if isinstance(h, BinaryAUCHook))
    metrics = hook.last_metrics
    assert metrics['binary_auc/num_images'] == 16
    assert {'binary_auc/auc', 'binary_auc/auc_norm/layer_1', 'binary_auc/auc/head_1'} <= set(
        metrics)
    assert 50 <= metrics['binary_auc/auc_norm'] <= 100
    model = runner.model
    student, teacher = model.backbone, model.teacher.backbone
    assert not torch.equal(student.cls_token, teacher.cls_token)  # training moved the student
    # the logged value is the teacher's
    metric = BinaryAUC()
    for data in hook._dataloader(runner):
        data = hook.preprocessor(data, False)
        fm = compute_featmaps(teacher, data['inputs'], layers=[0, 1])
        for sample, maps in zip(data['data_samples'], fm.maps):
            sample.set_field(maps, 'pred_featmap')
            sample.set_metainfo(dict(featmap_layers=fm.layers))
        metric.process(data, data['data_samples'])
    expected = metric.evaluate(16)
    assert metrics['binary_auc/auc'] == pytest.approx(expected['binary_auc/auc'], abs=1e-9)
    assert runner.message_hub.get_scalar('binary_auc/auc').current() == metrics['binary_auc/auc']
    for step in (1, 2):
        for i in range(2):
            assert osp.getsize(osp.join(runner.log_dir, 'binary_auc',
                                        f'step{step}_img{i}.png')) > 1000
    with open(osp.join(runner.log_dir, 'vis_data', 'scalars.json')) as f:
        logged = [json.loads(line) for line in f]
    assert [r['step'] for r in logged if 'binary_auc/auc' in r] == [1, 2]
    assert teacher.training  # the hook put the backbone back into its previous mode


def test_find_backbone_prefers_teacher():
    model = ToyDINO()
    assert find_backbone(model) is model.teacher.backbone
    del model.teacher
    assert find_backbone(model) is model.backbone
    with pytest.raises(AttributeError, match='has none of'):
        find_backbone(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match='interval'):
        BinaryAUCHook(dataloader=dict(), interval=0)
