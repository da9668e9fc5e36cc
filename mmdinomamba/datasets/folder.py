"""A labelled image folder with optional foreground masks: the layout of the demo and of your data.

::

    DATA_ROOT/
      classes.txt                      # one class name per line; line i is label i
      meta/train.txt, meta/val.txt     # "<relative path> <label>" per line
      train/<relative path>            # the images (any of .png .jpg .jpeg .bmp ...)
      val/<relative path>
      masks/train/<relative path>      # optional: binary foreground masks (0 background,
      masks/val/<relative path>        #   any non-zero value foreground), same relative path
                                       #   (a mask may also be a .png next to a .jpg image)

The dataset only reads: it never writes into, regenerates or deletes ``data_root``.
"""
import os.path as osp
from typing import List, Optional

from mmpretrain.datasets import CustomDataset
from mmpretrain.registry import DATASETS

__all__ = ['ImageFolderWithMasks', 'read_classes', 'check_folder_layout']

SPLITS = ('train', 'val')


def read_classes(data_root: str) -> List[str]:
    """The class names of ``<data_root>/classes.txt`` (non-empty lines, in order)."""
    path = osp.join(data_root, 'classes.txt')
    if not osp.isfile(path):
        raise FileNotFoundError(f'{path} is missing: a data folder needs classes.txt (one class '
                                'name per line)')
    with open(path) as f:
        names = [line.strip() for line in f if line.strip()]
    if not names:
        raise ValueError(f'{path} lists no class')
    return names


def check_folder_layout(data_root: str, splits=SPLITS) -> dict:
    """Check the documented layout; return ``dict(classes, num_images, has_masks)``.

    Raises ``FileNotFoundError`` / ``ValueError`` naming the missing file, or the line of an
    annotation file whose label is out of range or whose image is missing.
    """
    if not osp.isdir(data_root):
        raise FileNotFoundError(f'data folder {data_root} does not exist')
    classes = read_classes(data_root)
    counts, masks = {}, {}
    for split in splits:
        ann = osp.join(data_root, 'meta', f'{split}.txt')
        if not osp.isfile(ann):
            raise FileNotFoundError(f'{ann} is missing (lines "<path relative to {split}/> '
                                    '<label>")')
        n, with_mask = 0, True
        with open(ann) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                parts = line.rsplit(maxsplit=1)
                if len(parts) != 2 or not parts[1].lstrip('-').isdigit():
                    raise ValueError(f'{ann}:{lineno}: expected "<path> <label>", got '
                                     f'{line.strip()!r}')
                rel, label = parts[0], int(parts[1])
                if not 0 <= label < len(classes):
                    raise ValueError(f'{ann}:{lineno}: label {label} is not in [0, '
                                     f'{len(classes)}) (classes.txt has {len(classes)} names)')
                if not osp.isfile(osp.join(data_root, split, rel)):
                    raise FileNotFoundError(f'{ann}:{lineno}: image '
                                            f'{osp.join(data_root, split, rel)} is missing')
                with_mask = with_mask and mask_path(data_root, split, rel) is not None
                n += 1
        if n == 0:
            raise ValueError(f'{ann} lists no image')
        counts[split], masks[split] = n, with_mask
    return dict(classes=classes, num_images=counts, has_masks=all(masks.values()))


def mask_path(data_root: str, split: str, rel: str) -> Optional[str]:
    """The mask of image ``<split>/<rel>``: same relative path (or with .png) under masks/."""
    base = osp.join(data_root, 'masks', split, rel)
    for cand in (base, osp.splitext(base)[0] + '.png'):
        if osp.isfile(cand):
            return cand
    return None


@DATASETS.register_module()
class ImageFolderWithMasks(CustomDataset):
    """Classification data in the layout above (mmpretrain ``CustomDataset`` with an ann_file).

    Args:
        data_root (str): the folder.
        split (str): 'train' or 'val'. Defaults to 'train'.
        with_mask (bool): add ``fg_mask_path`` to every data info; every image must then have
            a mask (``FileNotFoundError`` naming the first one without). Defaults to False.
        **kwargs: passed to ``CustomDataset`` (``pipeline``, ``indices``, ...).
    """

    def __init__(self, data_root: str, split: str = 'train', with_mask: bool = False,
                 **kwargs):
        if split not in SPLITS:
            raise ValueError(f"{type(self).__name__}: split must be 'train' or 'val', "
                             f'got {split!r}')
        if not osp.isdir(data_root):
            raise FileNotFoundError(f'{type(self).__name__}: data_root {data_root!r} does not '
                                    'exist')
        self.split, self.with_mask = split, with_mask
        kwargs.setdefault('classes', read_classes(data_root))
        super().__init__(data_root=data_root, data_prefix=split, ann_file=f'meta/{split}.txt',
                         **kwargs)

    def load_data_list(self):
        data_list = super().load_data_list()
        if self.with_mask:
            img_root = osp.join(self.data_root, self.split)
            for info in data_list:
                rel = osp.relpath(info['img_path'], img_root)
                path = mask_path(self.data_root, self.split, rel)
                if path is None:
                    raise FileNotFoundError(
                        f'{type(self).__name__}: no foreground mask for {info["img_path"]} '
                        f'(looked for {osp.join(self.data_root, "masks", self.split, rel)})')
                info['fg_mask_path'] = path
        return data_list
