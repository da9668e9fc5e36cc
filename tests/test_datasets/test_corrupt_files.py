"""A corrupt image or mask file is named in the error (empty, truncated or not an image)."""
import os.path as osp
import re
import shutil

import pytest
from mmengine.config import Config
from mmpretrain.registry import DATASETS, TRANSFORMS

from mmdinomamba.datasets.transforms import LoadFgMask, LoadImageFromFile

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DINO_DEMO = osp.join(REPO, 'configs/pretrain/dino_dinovim-demo_1xb32-14e_embedded-64px.py')


def _corrupt(path, how):
    data = open(path, 'rb').read()
    open(path, 'wb').write({'empty': b'', 'truncated': data[:len(data) // 2],
                            'not an image': b'hello'}[how])


@pytest.fixture
def copy_root(embedded_root, tmp_path):
    root = tmp_path / 'emb'
    shutil.copytree(embedded_root, root)
    return root


def test_configs_load_images_through_the_naming_transform():
    assert TRANSFORMS.get('LoadImageFromFile') is LoadImageFromFile
    pipeline = Config.fromfile(DINO_DEMO).train_dataloader.dataset.pipeline
    assert isinstance(TRANSFORMS.build(pipeline[0]), LoadImageFromFile)


@pytest.mark.parametrize('how', ['empty', 'truncated', 'not an image'])
def test_corrupt_image_is_named(copy_root, how):
    ds = DATASETS.build(dict(type='EmbeddedShapes', data_root=str(copy_root), split='val',
                             pipeline=[dict(type='LoadImageFromFile')]))
    path = ds.get_data_info(2)['img_path']
    _corrupt(path, how)
    with pytest.raises(Exception, match=re.escape(path)):
        ds[2]
    ds[3]  # the others still load


@pytest.mark.parametrize('how', ['empty', 'truncated', 'not an image'])
def test_corrupt_mask_is_named(copy_root, how):
    ds = DATASETS.build(dict(type='EmbeddedShapes', data_root=str(copy_root), split='val',
                             with_mask=True, pipeline=[dict(type='LoadFgMask')]))
    path = ds.get_data_info(2)['fg_mask_path']
    _corrupt(path, how)
    with pytest.raises(OSError, match='cannot load mask ' + re.escape(path)):
        ds[2]


def test_bad_imagenet_s_mask_layout_is_named(copy_root):
    ds = DATASETS.build(dict(type='EmbeddedShapes', data_root=str(copy_root), split='val',
                             with_mask=True, pipeline=[LoadFgMask(mask_format='imagenet_s')]))
    ds[0]  # grey PNGs are converted to RGB: fine
    with pytest.raises(ValueError, match='unknown fg mask format'):
        LoadFgMask()(dict(fg_mask_path=ds.get_data_info(0)['fg_mask_path'],
                          fg_mask_format='other'))
