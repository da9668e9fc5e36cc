"""A folder of your own is checked before any training: a class without train or val images
and val images without masks are errors naming them (Binary-AUC may be skipped explicitly); a
mask of no listed image is a warning naming it."""
import os

import pytest
from repo_files import load_file

from mmdinomamba.datasets.folder import check_folder_layout

_own_folder = load_file('tests/test_demo/test_demo_runs.py')._own_folder


def test_a_consistent_folder_passes(tmp_path):
    _own_folder(str(tmp_path), with_masks=True)
    info = check_folder_layout(str(tmp_path))
    assert info['has_masks'] and info['num_images'] == dict(train=12, val=6)


def test_a_class_without_images_is_named(tmp_path):
    _own_folder(str(tmp_path))
    with open(tmp_path / 'classes.txt', 'a') as f:
        f.write('star\n')
    with pytest.raises(ValueError, match=r"classes.txt: 'star' \(line 4\) has no train image; "
                       r"'star' \(line 4\) has no val image"):
        check_folder_layout(str(tmp_path))
    lines = (tmp_path / 'meta' / 'val.txt').read_text().splitlines()
    (tmp_path / 'meta' / 'val.txt').write_text('\n'.join(l for l in lines if not l.endswith(' 2')))
    with open(tmp_path / 'classes.txt', 'w') as f:
        f.write('ring\nbar\nblob\n')
    with pytest.raises(ValueError, match=r"'blob' \(line 3\) has no val image"):
        check_folder_layout(str(tmp_path))


def test_missing_masks_are_named_unless_binary_auc_is_skipped(tmp_path):
    _own_folder(str(tmp_path), with_masks=True)
    for name in ('ring/0.png', 'bar/1.png'):
        os.remove(tmp_path / 'masks' / 'val' / name)
    with pytest.raises(FileNotFoundError) as err:
        check_folder_layout(str(tmp_path))
    message = str(err.value)
    assert '2 of 6 val images have no mask: val/ring/0.jpg, val/bar/1.jpg' in message
    assert '--skip-binary-auc' in message
    assert check_folder_layout(str(tmp_path), skip_masks=True)['has_masks'] is False


def test_a_mask_without_image_is_a_warning(tmp_path):
    _own_folder(str(tmp_path), with_masks=True)
    (tmp_path / 'masks' / 'val' / 'ring' / 'extra.png').write_bytes(b'x')
    with pytest.warns(UserWarning, match=r'1 mask\(s\) belong to no image of meta/val.txt.*'
                      'masks/val/ring/extra.png'):
        assert check_folder_layout(str(tmp_path))['has_masks']


def test_demo_data_skips_binary_auc_when_asked(tmp_path):
    from mmdinomamba.demo.data import prepare_data
    _own_folder(str(tmp_path), with_masks=True)
    assert prepare_data(str(tmp_path), generate=False).has_masks
    assert not prepare_data(str(tmp_path), generate=False, skip_masks=True).has_masks
