"""ImageNet-S validation set as a foreground-mask data set for Binary-AUC (paper Appendix B).

ImageNet-S (Gao et al., "Large-scale Unsupervised Semantic Segmentation", TPAMI 2022;
https://github.com/LUSSeg/ImageNet-S) annotates ImageNet images of 919 classes with semantic
masks. Layout made by its ``data_preparation.sh`` (the paper uses the 12,419 validation images)::

    <data_root>/ImageNetS919/validation/<wnid>/<name>.JPEG              # ImageNet val images
    <data_root>/ImageNetS919/validation-segmentation/<wnid>/<name>.png  # RGB semantic masks

Mask encoding (ImageNet-S README): class id = R + 256 * G; 0 = "other" (background), 1000 =
ignored; any other id is an object class. The ids are merged into one binary foreground mask and
ignored pixels are excluded from the AUC (:class:`LoadFgMask` with ``mask_format='imagenet_s'``).
"""
import os
import os.path as osp
from typing import List, Optional, Tuple

from mmengine.logging import MMLogger
from mmpretrain.datasets import BaseDataset
from mmpretrain.registry import DATASETS

IMG_EXTENSIONS = ('.JPEG', '.jpeg', '.jpg', '.JPG', '.png')


def _list_dir(path: str) -> List[str]:
    return sorted(e for e in os.listdir(path) if not e.startswith('.'))


def _find_image(img_dir: str, stem: str) -> Optional[str]:
    for ext in IMG_EXTENSIONS:
        path = osp.join(img_dir, stem + ext)
        if osp.isfile(path):
            return path
    return None


def scan_imagenet_s(root: str, split: str = 'validation', names: Optional[List[str]] = None
                    ) -> Tuple[List[str], List[dict]]:
    """Pair every mask of ``<root>/<split>-segmentation`` with its image in ``<root>/<split>``.

    Args:
        root (str): folder holding ``<split>`` and ``<split>-segmentation``.
        split (str): 'validation' (or 'train-semi'). Defaults to 'validation'.
        names (list[str], optional): restrict to these ``<wnid>/<name>`` stems.

    Returns:
        tuple: class folder names (sorted wnids) and data infos.

    Raises:
        FileNotFoundError: a folder is missing, a mask has no image, or an image has no mask.
    """
    img_root, seg_root = osp.join(root, split), osp.join(root, f'{split}-segmentation')
    for path in (img_root, seg_root):
        if not osp.isdir(path):
            raise FileNotFoundError(
                f'ImageNetS: folder not found: {path} (expected the ImageNet-S layout '
                f'<data_root>/[ImageNetS919/]{split}/<wnid>/<name>.JPEG and '
                f'{split}-segmentation/<wnid>/<name>.png; see LUSSeg/ImageNet-S)')
    wnids = [d for d in _list_dir(seg_root) if osp.isdir(osp.join(seg_root, d))]
    full = names is None
    if full:
        names = [f'{w}/{osp.splitext(f)[0]}' for w in wnids
                 for f in _list_dir(osp.join(seg_root, w)) if f.endswith('.png')]
    infos, missing = [], []
    label = {w: i for i, w in enumerate(wnids)}
    for stem in names:
        mask = osp.join(seg_root, stem + '.png')
        img = _find_image(img_root, stem)
        if img is None or not osp.isfile(mask):
            missing.append(mask if img is not None else osp.join(img_root, stem + '.JPEG'))
            continue
        infos.append(dict(img_path=img, fg_mask_path=mask, fg_mask_format='imagenet_s',
                          gt_label=label.get(stem.split('/')[0], -1)))
    if missing:
        raise FileNotFoundError(f'ImageNetS: {len(missing)} missing files under {root}, e.g. '
                                + ', '.join(missing[:3]))
    if full:
        _check_no_unmasked_images(img_root, seg_root)
    if not infos:
        raise FileNotFoundError(f'ImageNetS: no (image, mask) pairs found under {root}')
    return wnids, infos


def _check_no_unmasked_images(img_root: str, seg_root: str) -> None:
    """Every image of the split must have a mask (a mismatched download otherwise)."""
    extra = [osp.join(img_root, w, f) for w in _list_dir(img_root)
             if osp.isdir(osp.join(img_root, w)) for f in _list_dir(osp.join(img_root, w))
             if not osp.isfile(osp.join(seg_root, w, osp.splitext(f)[0] + '.png'))]
    if extra:
        raise FileNotFoundError(
            f'ImageNetS: {len(extra)} images have no mask in {seg_root}, e.g. '
            + ', '.join(extra[:3]) + ' (mismatched image and annotation folders; pass an '
            'ann_file to evaluate a subset)')


@DATASETS.register_module()
class ImageNetS(BaseDataset):
    """ImageNet-S images with binary foreground masks (919 classes in the full split).

    Each data info holds ``img_path``, ``gt_label`` (index of the wnid folder among the sorted
    folders), ``fg_mask_path`` and ``fg_mask_format='imagenet_s'``, as :class:`EmbeddedShapes`
    with ``with_mask=True`` does, so the same pipeline (``LoadImageFromFile``, ``LoadFgMask``,
    ``Resize``, ``PackInputs(algorithm_keys=['gt_seg_map'])``) serves both.

    Args:
        data_root (str): ImageNet-S root. If ``<data_root>/<subset>`` exists it is used,
            otherwise ``data_root`` itself must hold ``<split>/``. Defaults to 'data/imagenet-s'.
        subset (str): 'ImageNetS919', 'ImageNetS300' or 'ImageNetS50'. Defaults to
            'ImageNetS919'.
        split (str): 'validation' or 'train-semi'. Defaults to 'validation'.
        ann_file (str): optional list of ``<wnid>/<name>`` lines (extensions ignored), relative
            to the resolved root, to evaluate a subset. Defaults to ''.
        **kwargs: passed to :class:`mmpretrain.datasets.BaseDataset` (``pipeline``, ...).
    """
    NUM_CLASSES = {'ImageNetS919': 919, 'ImageNetS300': 300, 'ImageNetS50': 50}

    def __init__(self, data_root: str = 'data/imagenet-s', subset: str = 'ImageNetS919',
                 split: str = 'validation', ann_file: str = '', **kwargs):
        root = osp.join(data_root, subset)
        self.root = root if osp.isdir(root) else data_root
        names = None
        if ann_file:
            path = ann_file if osp.isabs(ann_file) else osp.join(self.root, ann_file)
            if not osp.isfile(path):
                raise FileNotFoundError(f'ImageNetS: ann_file not found: {path}')
            with open(path) as f:
                names = [osp.splitext(line.split()[0])[0] for line in f if line.strip()]
        self.wnids, self._infos = scan_imagenet_s(self.root, split, names)
        expected = self.NUM_CLASSES.get(subset)
        if names is None and expected and len(self.wnids) != expected:
            MMLogger.get_current_instance().warning(
                f'ImageNetS: {len(self.wnids)} class folders under {self.root}, expected '
                f'{expected} for {subset}')
        super().__init__(ann_file='', data_root=data_root,
                         metainfo=dict(classes=tuple(self.wnids)), **kwargs)

    def load_data_list(self) -> List[dict]:
        return [dict(info) for info in self._infos]
