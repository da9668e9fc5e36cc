"""ImageNetS data set on a tiny fake layout, and the LoadFgMask transform."""
import os

import numpy as np
import pytest
from PIL import Image

from mmdinomamba.datasets import ImageNetS
from mmdinomamba.datasets.transforms import LoadFgMask, decode_fg_mask


def _encode(ids):
    """ImageNet-S encoding: R = id % 256, G = id // 256."""
    return np.stack([ids % 256, ids // 256, np.zeros_like(ids)], -1).astype(np.uint8)


def _make_layout(root, sizes=((20, 30), (24, 24), (16, 40))):
    wnids = ['n01443537', 'n04355933']
    names = []
    for i, (h, w) in enumerate(sizes):
        wnid = wnids[i % 2]
        for sub in ('validation', 'validation-segmentation'):
            os.makedirs(root / 'ImageNetS919' / sub / wnid, exist_ok=True)
        name = f'ILSVRC2012_val_{i:08d}'
        img = np.random.default_rng(i).integers(0, 255, (h, w, 3), dtype=np.uint8)
        Image.fromarray(img).save(root / 'ImageNetS919' / 'validation' / wnid / f'{name}.JPEG')
        ids = np.zeros((h, w), np.int64)
        ids[h // 4:, : w // 2] = 300 + i  # a class id > 255 (uses the G channel)
        ids[:2, :] = 1000  # ignored
        Image.fromarray(_encode(ids)).save(
            root / 'ImageNetS919' / 'validation-segmentation' / wnid / f'{name}.png')
        names.append((wnid, name, ids))
    return names


def test_imagenet_s_layout_and_masks(tmp_path):
    names = _make_layout(tmp_path)
    ds = ImageNetS(data_root=str(tmp_path), pipeline=[
        dict(type='LoadImageFromFile'), dict(type='LoadFgMask'),
        dict(type='Resize', scale=(32, 32)),
        dict(type='PackInputs', algorithm_keys=['gt_seg_map'])])
    assert len(ds) == 3 and ds.metainfo['classes'] == ('n01443537', 'n04355933')
    info = ds.get_data_info(2)  # sorted by wnid, then name: image 1 comes last
    assert info['gt_label'] == 1 and info['fg_mask_format'] == 'imagenet_s'
    assert info['fg_mask_path'].endswith('validation-segmentation/n04355933/'
                                         'ILSVRC2012_val_00000001.png')
    out = ds[0]
    seg = out['data_samples'].gt_seg_map
    assert out['inputs'].shape == (3, 32, 32) and seg.shape == (32, 32)
    assert set(np.unique(seg)) == {0, 1, 255}
    raw = LoadFgMask()(dict(fg_mask_path=info['fg_mask_path'], fg_mask_format='imagenet_s'))
    ids = names[1][2]
    expected = (ids > 0).astype(np.uint8)
    expected[ids == 1000] = 255
    assert np.array_equal(raw['gt_seg_map'], expected)


def test_imagenet_s_subset_ann_file(tmp_path):
    _make_layout(tmp_path)
    (tmp_path / 'ImageNetS919' / 'sub.txt').write_text('n04355933/ILSVRC2012_val_00000001.JPEG\n')
    ds = ImageNetS(data_root=str(tmp_path), ann_file='sub.txt')
    assert len(ds) == 1


def test_imagenet_s_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match='validation'):
        ImageNetS(data_root=str(tmp_path / 'nowhere'))
    names = _make_layout(tmp_path)
    wnid, name, _ = names[0]
    img = tmp_path / 'ImageNetS919' / 'validation' / wnid / f'{name}.JPEG'
    os.remove(img)
    with pytest.raises(FileNotFoundError, match=f'{wnid}/{name}.JPEG'):
        ImageNetS(data_root=str(tmp_path))
    Image.new('RGB', (8, 8)).save(img)
    extra = tmp_path / 'ImageNetS919' / 'validation' / wnid / 'stray.JPEG'
    Image.new('RGB', (8, 8)).save(extra)
    with pytest.raises(FileNotFoundError, match='stray.JPEG'):
        ImageNetS(data_root=str(tmp_path))


def test_load_fg_mask_binary_and_errors(tmp_path):
    mask = np.zeros((6, 5), np.uint8)
    mask[2:, 1:3] = 255
    Image.fromarray(mask).save(tmp_path / 'm.png')
    out = LoadFgMask()(dict(fg_mask_path=str(tmp_path / 'm.png'), img=np.zeros((6, 5, 3))))
    assert np.array_equal(out['gt_seg_map'], (mask > 0).astype(np.uint8))
    with pytest.raises(ValueError, match='m.png'):
        LoadFgMask()(dict(fg_mask_path=str(tmp_path / 'm.png'), img=np.zeros((7, 5, 3)),
                          img_path='x.png'))
    with pytest.raises(FileNotFoundError, match='missing.png'):
        LoadFgMask()(dict(fg_mask_path=str(tmp_path / 'missing.png')))
    with pytest.raises(KeyError, match='fg_mask_path'):
        LoadFgMask()(dict())
    with pytest.raises(ValueError, match='RGB'):
        decode_fg_mask(mask, 'imagenet_s')


def test_embedded_masks_through_pipeline(embedded_root):
    from mmpretrain.registry import DATASETS
    ds = DATASETS.build(dict(
        type='EmbeddedShapes', data_root=str(embedded_root), split='val', with_mask=True,
        num_train=48, num_val=16, img_size=64,
        pipeline=[dict(type='LoadImageFromFile'), dict(type='LoadFgMask'),
                  dict(type='PackInputs', algorithm_keys=['gt_seg_map'])]))
    seg = ds[0]['data_samples'].gt_seg_map
    assert seg.shape == (64, 64) and set(np.unique(seg)) <= {0, 1} and seg.any()
