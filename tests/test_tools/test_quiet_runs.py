"""What a user sees on every run: no notices from our code or the stack it wraps."""
import logging
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.logging import MMLogger

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@pytest.mark.parametrize('module', ['mmdinomamba', 'mmdinomamba.downstream'])
def test_import_prints_nothing(module):
    done = subprocess.run([sys.executable, '-c', f'import {module}'], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == '' and done.stderr == ''


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_dino_optimizer_lists_frozen_parameters_once():
    """DINO's frozen last-layer norm: one INFO line, not one WARNING per parameter."""
    from mmpretrain.registry import MODELS, OPTIM_WRAPPER_CONSTRUCTORS
    model = MODELS.build(dict(
        type='DINO', backbone=dict(type='ViT', arch=dict(embed_dims=32, num_layers=1,
                                                         num_heads=2), img_size=32),
        head=dict(type='DINOHead', in_channels=32, out_channels=16, hidden_channels=16,
                  bottleneck_channels=8)))
    constructor = OPTIM_WRAPPER_CONSTRUCTORS.build(dict(
        type='DINOOptimWrapperConstructor', paramwise_cfg=dict(flat_decay_mult=0.),
        optim_wrapper_cfg=dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-3))))
    handler = _Records()
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        constructor(model)
    finally:
        logger.removeHandler(handler)
    warnings = [r.getMessage() for r in handler.records if r.levelno >= logging.WARNING]
    assert warnings == []
    frozen = [r.getMessage() for r in handler.records if 'frozen, not optimized' in r.getMessage()]
    assert len(frozen) == 1 and 'head.last_layer.weight_g' in frozen[0]


def test_checkpoint_hook_without_file_client_notices(tmp_path):
    """mmengine builds a deprecated FileClient at the start and at every save; the atomic
    checkpoint hook (every config's) does not pass its warnings on."""
    import torch
    from mmengine.model import BaseModel
    from mmengine.runner import Runner

    class Toy(BaseModel):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, inputs, data_samples=None, mode='loss'):
            return dict(loss=(self.w * inputs).sum())

    loader = dict(dataset=[dict(inputs=torch.ones(1))] * 4, batch_size=2, num_workers=0,
                  sampler=dict(type='DefaultSampler', shuffle=False),
                  collate_fn=dict(type='default_collate'))
    runner = Runner(model=Toy(), work_dir=str(tmp_path), train_dataloader=loader,
                    train_cfg=dict(by_epoch=True, max_epochs=1),
                    optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
                    default_hooks=dict(checkpoint=dict(type='AtomicCheckpointHook', interval=1)),
                    default_scope='mmpretrain')
    handler = _Records()
    runner.logger.addHandler(handler)
    try:
        runner.train()
    finally:
        runner.logger.removeHandler(handler)
    assert osp.isfile(tmp_path / 'epoch_1.pth')
    notices = [r.getMessage() for r in handler.records if 'FileClient' in r.getMessage()
               or 'HardDiskBackend' in r.getMessage()]
    assert notices == []
