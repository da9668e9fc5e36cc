"""KNNEvalHook: DINO's weighted k-NN of the teacher backbone, usable from any config."""
from copy import deepcopy

import pytest
import torch
from mmengine.model import BaseModel
from mmengine.runner import Runner

from mmdinomamba.engine.hooks import KNNEvalHook
from mmdinomamba.evaluation.knn import knn_predict


class PoolBackbone(torch.nn.Module):
    """(B, 3, H, W) -> ((B, 8),): a conv, then global average pooling."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 8, 8)

    def forward(self, x):
        return (self.conv(x).mean((2, 3)), )


class ToyDINO(BaseModel):
    """A student trained on a dummy loss; the teacher is a frozen copy of its first weights."""

    def __init__(self):
        super().__init__(data_preprocessor=dict(type='mmpretrain.ClsDataPreprocessor',
                                                mean=[127.5] * 3, std=[127.5] * 3))
        self.backbone = PoolBackbone()
        self.teacher = torch.nn.Module()
        self.teacher.backbone = deepcopy(self.backbone).requires_grad_(False)

    def forward(self, inputs, data_samples=None, mode='loss'):
        return dict(loss=self.backbone(inputs)[0].pow(2).mean())


def _data(root, split):
    return dict(type='EmbeddedShapes', data_root=str(root), split=split, num_train=48,
                num_val=16, img_size=64,
                pipeline=[dict(type='LoadImageFromFile'), dict(type='PackInputs')])


def test_hook_logs_the_teachers_knn(tmp_path, embedded_root):
    pre = dict(type='ClsDataPreprocessor', mean=[127.5] * 3, std=[127.5] * 3)
    runner = Runner(
        model=ToyDINO(), work_dir=str(tmp_path), default_scope='mmpretrain',
        train_dataloader=dict(batch_size=16, num_workers=0,
                              sampler=dict(type='DefaultSampler', shuffle=True),
                              dataset=_data(embedded_root, 'train')),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.5)),
        custom_hooks=[dict(type='KNNEvalHook', interval=1, k=5, data_preprocessor=pre,
                           train_dataloader=dict(batch_size=10,
                                                 dataset=_data(embedded_root, 'train')),
                           val_dataloader=dict(batch_size=7,
                                               dataset=_data(embedded_root, 'val')))],
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=100)),
        log_level='WARNING')
    runner.train()
    hook = next(h for h in runner.hooks if isinstance(h, KNNEvalHook))
    assert set(hook.last_metrics) == {'knn/top1'}
    assert runner.message_hub.get_scalar('knn/top1').current() == hook.last_metrics['knn/top1']
    # the logged number is the teacher's (the student moved), over all 48 + 16 images
    student, teacher = runner.model.backbone, runner.model.teacher.backbone
    assert not torch.equal(student.conv.weight, teacher.conv.weight)
    feats = {}
    for split in ('train', 'val'):
        loader = hook._loaders[f'{split}_dataloader']
        xs, ys = [], []
        for data in loader:
            data = hook.preprocessor(data, False)
            xs.append(teacher(data['inputs'])[0])
            ys.append(torch.cat([s.gt_label for s in data['data_samples']]))
        feats[split] = torch.cat(xs), torch.cat(ys)
    assert len(feats['train'][1]) == 48 and len(feats['val'][1]) == 16
    pred = knn_predict(*feats['train'], feats['val'][0], 6, k=5)
    expected = 100. * float((pred == feats['val'][1]).float().mean())
    assert hook.last_metrics['knn/top1'] == pytest.approx(expected)


@pytest.mark.parametrize('kwargs,match', [(dict(interval=0), 'interval'), (dict(k=0), 'k >= 1'),
                                          (dict(temperature=0.), 'temperature')])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KNNEvalHook(dict(dataset={}), dict(dataset={}), **kwargs)


def test_a_loader_without_dataset_is_named():
    hook = KNNEvalHook(dict(batch_size=4), dict(dataset={}))
    with pytest.raises(KeyError, match='train_dataloader needs a "dataset"'):
        hook.compute(PoolBackbone())
