"""Fixtures for the downstream tests: the demo seg/det configs pointed at the small test
embedded data set (``embedded_root``: 64 px, 48 train / 16 val images)."""
import os.path as osp

import pytest

pytest.importorskip('mmseg')
pytest.importorskip('mmdet')

from mmengine.config import Config  # noqa: E402

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SEG_DEMO = osp.join(REPO, 'configs/seg/upernet_dinovim-demo_1xb8-300i_embedded-128x128.py')
DET_DEMO = osp.join(
    REPO, 'configs/det/cascade-mask-rcnn_dinovim-demo-simplefpn_1xb4-300i_embedded-128x128.py')
TINY_VIM = dict(arch=dict(embed_dims=32, num_layers=2), mixer_cfg=dict(d_state=8, headdim=16))


@pytest.fixture(scope='session')
def embedded_kwargs(embedded_root):
    """Dataset keywords that select the test data set without regenerating it."""
    return dict(data_root=str(embedded_root), num_train=48, num_val=16, img_size=64, seed=0)


def _point_at(cfg: Config, kwargs: dict) -> Config:
    for name in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[name].dataset.update(kwargs)
        cfg[name].batch_size = 2
    return cfg


@pytest.fixture
def seg_cfg(embedded_kwargs):
    """The seg demo config with a 32-wide, 2-block DinoVim on the test data."""
    cfg = _point_at(Config.fromfile(SEG_DEMO), embedded_kwargs)
    cfg.model.backbone.update(TINY_VIM, out_indices=(0, 1, 0, 1))
    cfg.model.neck.update(in_channels=[32] * 4, out_channels=32)
    cfg.model.decode_head.update(in_channels=[32] * 4, channels=32)
    cfg.model.auxiliary_head.update(in_channels=32, channels=16)
    return cfg


@pytest.fixture
def det_cfg(embedded_kwargs):
    """The det demo config with a 32-wide, 2-block DinoVim on the test data."""
    cfg = _point_at(Config.fromfile(DET_DEMO), embedded_kwargs)
    cfg.model.backbone.update(TINY_VIM)
    cfg.model.neck.in_channels = 32
    cfg.val_evaluator.ann_file = osp.join(embedded_kwargs['data_root'],
                                          'coco/annotations/instances_val.json')
    cfg.test_evaluator = cfg.val_evaluator
    return cfg
