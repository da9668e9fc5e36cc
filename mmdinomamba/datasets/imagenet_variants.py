"""ImageNet distribution-shift test sets (paper Table 4), labelled in the ImageNet-1k index space.

Every data set here gives ``gt_label`` = the ImageNet-1k class index (0..999, sorted-wnid order,
the order of mmpretrain's ``IMAGENET_CATEGORIES``), whatever its folder naming, so one 1000-way
probe head evaluates all of them:

* ImageNet-V2 (Recht et al., 2019; matched-frequency, threshold-0.7, top-images): folders named
  by the class INDEX, ``<root>/<0..999>/<hash>.jpeg`` (``folder_names='index'``).
* ImageNet-Sketch (Wang et al., 2019): ``<root>/<wnid>/*.JPEG``, 1000 folders.
* ImageNet-A / ImageNet-R (Hendrycks et al., 2021): ``<root>/<wnid>/*.jpg``, 200 folders each
  (``subset='imagenet-a' | 'imagenet-r'``; folders outside the subset are an error). Their
  accuracy restricts the 1000-way prediction to the 200 classes (``RestrictedAccuracy``).
* ImageNet-ReaL (Beyer et al., 2020): the ILSVRC-2012 val images with the reassessed multi-label
  annotations ``real.json`` (:class:`ImageNetReaL`).
"""
import json
import os
import os.path as osp
import re
from typing import List, Optional

from mmengine.dataset import BaseDataset
from mmpretrain.datasets import ImageNet
from mmpretrain.datasets.categories import IMAGENET_CATEGORIES
from mmpretrain.registry import DATASETS

from .imagenet_wnids import IMAGENET_A_WNIDS, IMAGENET_R_WNIDS, WNID_TO_INDEX

__all__ = ['ImageNetVariant', 'ImageNetReaL', 'SUBSETS', 'subset_indices', 'load_real_labels']

IMG_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff', '.webp')
#: 200-class subsets: name -> sorted wnids
SUBSETS = {'imagenet-a': IMAGENET_A_WNIDS, 'imagenet-r': IMAGENET_R_WNIDS}


def subset_indices(subset) -> List[int]:
    """ImageNet-1k indices (ascending) of a subset: a key of :data:`SUBSETS` or wnids."""
    if isinstance(subset, str):
        if subset not in SUBSETS:
            raise KeyError(f'unknown class subset {subset!r}; choose one of {sorted(SUBSETS)} '
                           'or pass a list of wnids')
        subset = SUBSETS[subset]
    unknown = [w for w in subset if w not in WNID_TO_INDEX]
    if unknown:
        raise ValueError(f'wnids not in ImageNet-1k: {unknown[:5]} ({len(unknown)} in all)')
    return sorted(WNID_TO_INDEX[w] for w in subset)


def _folder_label(name: str, folder_names: str, allowed: Optional[set], root: str) -> int:
    if folder_names == 'index':
        if not name.isdigit() or not 0 <= int(name) < 1000:
            raise ValueError(f'{osp.join(root, name)}: folder_names="index" expects class '
                             'folders named 0..999 (the ImageNet-V2 layout)')
        return int(name)
    if name not in WNID_TO_INDEX:
        raise ValueError(f'{osp.join(root, name)}: folder is not an ImageNet-1k wnid '
                         '(expected <root>/<wnid>/<image>, e.g. n01440764/)')
    if allowed is not None and name not in allowed:
        raise ValueError(f'{osp.join(root, name)}: wnid {name} is not one of the 200 classes '
                         'of this subset')
    return WNID_TO_INDEX[name]


@DATASETS.register_module()
class ImageNetVariant(BaseDataset):
    """A folder-per-class ImageNet test set, labelled with ImageNet-1k indices.

    Args:
        data_root (str): the folder holding one sub-folder per class.
        folder_names (str): 'wnid' (``n01440764/``, Sketch / A / R) or 'index' (``0/`` ..
            ``999/``, ImageNet-V2). Defaults to 'wnid'.
        subset (str | Sequence[str], optional): restrict the allowed class folders to
            'imagenet-a', 'imagenet-r' or a list of wnids. Defaults to None (all 1000).
        data_prefix (str | dict): sub-folder of ``data_root``. Defaults to ''.
        **kwargs: ``pipeline``, ``indices``, ``lazy_init`` ... of ``BaseDataset``.
    """
    METAINFO = {'classes': IMAGENET_CATEGORIES}

    def __init__(self, data_root: str, folder_names: str = 'wnid', subset=None,
                 data_prefix='', test_mode: bool = True, **kwargs):
        if folder_names not in ('wnid', 'index'):
            raise ValueError(f"folder_names={folder_names!r} is not 'wnid' or 'index'")
        if subset is not None and folder_names != 'wnid':
            raise ValueError('subset applies to wnid-named folders only')
        self.folder_names = folder_names
        self.subset = subset
        if isinstance(subset, str):
            if subset not in SUBSETS:
                raise KeyError(f'unknown subset {subset!r}; choose one of {sorted(SUBSETS)}')
            subset = SUBSETS[subset]
        self._allowed = None if subset is None else set(subset)
        if isinstance(data_prefix, str):
            data_prefix = dict(img_path=data_prefix)
        super().__init__(data_root=data_root, data_prefix=data_prefix, test_mode=test_mode,
                         **kwargs)

    def load_data_list(self) -> List[dict]:
        root = self.data_prefix['img_path']
        if not osp.isdir(root):
            raise FileNotFoundError(f'{type(self).__name__}: image folder {root} not found')
        data_list = []
        for name in sorted(os.listdir(root)):
            folder = osp.join(root, name)
            if not osp.isdir(folder):
                continue
            label = _folder_label(name, self.folder_names, self._allowed, root)
            for dirpath, _, files in sorted(os.walk(folder)):
                for fname in sorted(files):
                    if fname.lower().endswith(IMG_EXTENSIONS):
                        data_list.append(dict(img_path=osp.join(dirpath, fname), gt_label=label))
        if not data_list:
            raise ValueError(f'{type(self).__name__}: no images under {root}/<class>/')
        return data_list


_VAL_NAME = re.compile(r'ILSVRC2012_val_(\d{8})')


def load_real_labels(path: str) -> List[List[int]]:
    """``real.json``: a JSON list, one entry per ILSVRC-2012 val image in file-number order
    (``ILSVRC2012_val_00000001`` first), each a (possibly empty) list of class indices."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'ImageNet-ReaL labels {path} not found (real.json from '
                                'github.com/google-research/reassessed-imagenet)')
    with open(path) as f:
        real = json.load(f)
    if not isinstance(real, list) or not all(isinstance(r, list) for r in real):
        raise ValueError(f'{path}: expected a JSON list of label lists (one per val image)')
    return real


@DATASETS.register_module()
class ImageNetReaL(ImageNet):
    """The ILSVRC-2012 val images with ImageNet-ReaL labels (``real_labels`` per data info).

    Images may be in either mmpretrain ImageNet layout (``val/<wnid>/`` or flat ``val/`` +
    ``meta/val.txt``); each image's ReaL entry is found from the number in its file name
    (``ILSVRC2012_val_00012345.JPEG`` -> entry 12344). Images whose ReaL list is empty stay in
    the data set and are excluded by the ``ReaLAccuracy`` metric (as in Beyer et al.).

    Args:
        real_file (str): path of ``real.json`` (relative paths are joined with ``data_root``).
            Defaults to 'real.json'.
        data_root (str): ImageNet root. Defaults to ''.
        split (str): Defaults to 'val'.
        **kwargs: see mmpretrain ``ImageNet``.
    """

    def __init__(self, real_file: str = 'real.json', data_root: str = '', split: str = 'val',
                 **kwargs):
        self.real_file = real_file if osp.isabs(real_file) else osp.join(data_root, real_file)
        super().__init__(data_root=data_root, split=split, **kwargs)

    def load_data_list(self) -> List[dict]:
        real = load_real_labels(self.real_file)
        data_list = super().load_data_list()
        for info in data_list:
            match = _VAL_NAME.search(osp.basename(info['img_path']))
            if match is None:
                raise ValueError(f'{info["img_path"]}: not an ILSVRC2012_val_XXXXXXXX file name')
            index = int(match.group(1)) - 1
            if not 0 <= index < len(real):
                raise IndexError(f'{info["img_path"]}: image number {index + 1} is beyond the '
                                 f'{len(real)} entries of {self.real_file}')
            info['real_labels'] = [int(c) for c in real[index]]
        return data_list
