"""ImageNet wnid tables, the 200-class subsets, ImageNetVariant and ImageNetReaL."""
import json
import os

import numpy as np
import pytest
from mmpretrain.datasets.categories import IMAGENET_CATEGORIES
from PIL import Image

from mmdinomamba.datasets import ImageNetReaL, ImageNetVariant
from mmdinomamba.datasets.imagenet_variants import subset_indices
from mmdinomamba.datasets.imagenet_wnids import (IMAGENET_A_WNIDS, IMAGENET_R_WNIDS,
                                                 IMAGENET_WNIDS, WNID_TO_INDEX)


def _img(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(path)


def test_wnid_tables_are_consistent():
    assert len(IMAGENET_WNIDS) == len(set(IMAGENET_WNIDS)) == 1000
    assert list(IMAGENET_WNIDS) == sorted(IMAGENET_WNIDS) and len(IMAGENET_CATEGORIES) == 1000
    for sub in (IMAGENET_A_WNIDS, IMAGENET_R_WNIDS):
        assert len(sub) == len(set(sub)) == 200 and set(sub) <= set(IMAGENET_WNIDS)
    assert len(set(IMAGENET_A_WNIDS) & set(IMAGENET_R_WNIDS)) > 50  # overlapping, not equal
    assert set(IMAGENET_A_WNIDS) != set(IMAGENET_R_WNIDS)


def test_wnid_order_matches_mmpretrain_class_names():
    """Independent check: torchvision's Imagenette table (wnid -> names) against mmpretrain's
    ImageNet class names at our index."""
    imagenette = pytest.importorskip('torchvision.datasets.imagenette').Imagenette
    for wnid, names in imagenette._WNID_TO_CLASS.items():
        assert IMAGENET_CATEGORIES[WNID_TO_INDEX[wnid]].split(', ')[0] == names[0]
    assert IMAGENET_CATEGORIES[WNID_TO_INDEX['n15075141']].startswith('toilet tissue')


def test_subset_indices_map_back_to_the_wnids():
    for name, wnids in (('imagenet-a', IMAGENET_A_WNIDS), ('imagenet-r', IMAGENET_R_WNIDS)):
        idx = subset_indices(name)
        assert idx == sorted(idx) and len(idx) == 200
        assert [IMAGENET_WNIDS[i] for i in idx] == list(wnids)  # sorted wnids = sorted indices
    # well-known members: ImageNet-A class 0 is n01498041 (index 6), ImageNet-R's n01443537 (1)
    assert subset_indices('imagenet-a')[0] == 6 and subset_indices('imagenet-r')[0] == 1
    assert subset_indices(['n01440764', 'n15075141']) == [0, 999]
    with pytest.raises(KeyError, match='imagenet-b'):
        subset_indices('imagenet-b')
    with pytest.raises(ValueError, match='n00000000'):
        subset_indices(['n00000000'])


def test_index_folders_v2_layout(tmp_path):
    for cls, n in (('0', 2), ('10', 1), ('999', 1)):
        for i in range(n):
            _img(str(tmp_path / cls / f'{i}.jpeg'))
    ds = ImageNetVariant(data_root=str(tmp_path), folder_names='index', pipeline=[])
    assert sorted(ds.get_data_info(i)['gt_label'] for i in range(len(ds))) == [0, 0, 10, 999]
    _img(str(tmp_path / 'n01440764' / 'x.jpeg'))
    with pytest.raises(ValueError, match='n01440764'):
        ImageNetVariant(data_root=str(tmp_path), folder_names='index')


def test_wnid_folders_with_subset(tmp_path):
    a0, a5 = IMAGENET_A_WNIDS[0], IMAGENET_A_WNIDS[5]
    _img(str(tmp_path / a0 / 'a.jpg'))
    _img(str(tmp_path / a5 / 'b.JPG'))
    (tmp_path / 'README.txt').write_text('ignored')
    (tmp_path / a5 / 'notes.txt').write_text('ignored')
    ds = ImageNetVariant(data_root=str(tmp_path), subset='imagenet-a')
    labels = {os.path.basename(ds.get_data_info(i)['img_path']): ds.get_data_info(i)['gt_label']
              for i in range(len(ds))}
    assert labels == {'a.jpg': WNID_TO_INDEX[a0], 'b.JPG': WNID_TO_INDEX[a5]}
    assert ds.metainfo['classes'][WNID_TO_INDEX[a0]] == IMAGENET_CATEGORIES[WNID_TO_INDEX[a0]]
    outside = next(w for w in IMAGENET_WNIDS if w not in set(IMAGENET_A_WNIDS))
    _img(str(tmp_path / outside / 'c.jpg'))
    with pytest.raises(ValueError, match=f'{outside} is not one of the 200'):
        ImageNetVariant(data_root=str(tmp_path), subset='imagenet-a')
    ds = ImageNetVariant(data_root=str(tmp_path))  # no subset: any ImageNet wnid
    assert len(ds) == 3
    _img(str(tmp_path / 'cats' / 'd.jpg'))
    with pytest.raises(ValueError, match='not an ImageNet-1k wnid'):
        ImageNetVariant(data_root=str(tmp_path))


def test_variant_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match='not found'):
        ImageNetVariant(data_root=str(tmp_path / 'missing'))
    with pytest.raises(ValueError, match='no images'):
        ImageNetVariant(data_root=str(tmp_path))
    with pytest.raises(ValueError, match='folder_names'):
        ImageNetVariant(data_root=str(tmp_path), folder_names='name')
    with pytest.raises(KeyError, match='imagenet-x'):
        ImageNetVariant(data_root=str(tmp_path), subset='imagenet-x')


@pytest.mark.parametrize('layout', ['wnid-folders', 'flat+meta'])
def test_real_labels_follow_the_file_number(tmp_path, layout):
    real = [[0], [], [3, 7], [2]]
    (tmp_path / 'real.json').write_text(json.dumps(real))
    labels = {1: 0, 2: 0, 3: 3, 4: 3}
    if layout == 'wnid-folders':  # mmpretrain ImageNet wants all 1000 class folders
        for wnid in IMAGENET_WNIDS:
            os.makedirs(tmp_path / 'val' / wnid)
    lines = []
    for num, label in labels.items():
        name = f'ILSVRC2012_val_{num:08d}.JPEG'
        sub = IMAGENET_WNIDS[label] + '/' if layout == 'wnid-folders' else ''
        _img(str(tmp_path / 'val' / f'{sub}{name}'))
        lines.append(f'{name} {label}')
    if layout == 'flat+meta':
        os.makedirs(tmp_path / 'meta')
        (tmp_path / 'meta' / 'val.txt').write_text('\n'.join(lines) + '\n')
    ds = ImageNetReaL(data_root=str(tmp_path), split='val', pipeline=[])
    infos = [ds.get_data_info(i) for i in range(len(ds))]
    got = {os.path.basename(i['img_path']): (i['real_labels'], i['gt_label']) for i in infos}
    assert got == {f'ILSVRC2012_val_{n:08d}.JPEG': (real[n - 1], labels[n]) for n in labels}
    with pytest.raises(FileNotFoundError, match='nothere.json'):
        ImageNetReaL(data_root=str(tmp_path), real_file='nothere.json')
    (tmp_path / 'short.json').write_text(json.dumps(real[:2]))
    with pytest.raises(IndexError, match='image number 3'):
        ImageNetReaL(data_root=str(tmp_path), real_file='short.json')
