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
:func:`check_folder_layout` checks such a folder before any training: every class of
``classes.txt`` has train and val images; with ``masks/``, every val image has its mask (the
missing ones are named; Binary-AUC may be skipped explicitly instead); a mask of no listed image
is a warning naming it.
"""
import os
import os.path as osp
import warnings
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


#: the split whose masks Binary-AUC reads
MASK_SPLIT = 'val'
#: how many file names an error or warning lists
SHOWN = 5


def _listed(items: list) -> str:
    more = len(items) - SHOWN
    return ', '.join(items[:SHOWN]) + (f' (+{more} more)' if more > 0 else '')


def _read_split(data_root: str, split: str, num_classes: int) -> list:
    """The ``(relative path, label)`` lines of ``meta/<split>.txt``, every image checked."""
    ann = osp.join(data_root, 'meta', f'{split}.txt')
    if not osp.isfile(ann):
        raise FileNotFoundError(f'{ann} is missing (lines "<path relative to {split}/> '
                                '<label>")')
    items = []
    with open(ann) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.rsplit(maxsplit=1)
            if len(parts) != 2 or not parts[1].lstrip('-').isdigit():
                raise ValueError(f'{ann}:{lineno}: expected "<path> <label>", got '
                                 f'{line.strip()!r}')
            rel, label = parts[0], int(parts[1])
            if not 0 <= label < num_classes:
                raise ValueError(f'{ann}:{lineno}: label {label} is not in [0, '
                                 f'{num_classes}) (classes.txt has {num_classes} names)')
            if not osp.isfile(osp.join(data_root, split, rel)):
                raise FileNotFoundError(f'{ann}:{lineno}: image '
                                        f'{osp.join(data_root, split, rel)} is missing')
            items.append((rel, label))
    if not items:
        raise ValueError(f'{ann} lists no image')
    return items


def _check_classes(data_root: str, classes: List[str], items: dict) -> None:
    """Every class of ``classes.txt`` has an image in every split."""
    empty = []
    for split, lines in items.items():
        used = {label for _, label in lines}
        empty += [f'{classes[i]!r} (line {i + 1}) has no {split} image'
                  for i in range(len(classes)) if i not in used]
    if empty:
        raise ValueError(
            f'{osp.join(data_root, "classes.txt")}: {"; ".join(empty[:SHOWN])}'
            f'{f" (+{len(empty) - SHOWN} more)" if len(empty) > SHOWN else ""}. Every class '
            'needs train and val images (meta/train.txt, meta/val.txt): add images of it, or '
            'remove the class (and renumber the labels after it)')


def _orphan_masks(data_root: str, split: str, rels: list) -> list:
    """The masks under ``masks/<split>/`` that belong to no listed image."""
    folder = osp.join(data_root, 'masks', split)
    known = set(rels) | {osp.splitext(r)[0] + '.png' for r in rels}
    orphans = []
    for d, _, files in os.walk(folder):
        for name in files:
            rel = osp.relpath(osp.join(d, name), folder)
            if rel not in known and not name.startswith('.'):
                orphans.append(osp.join('masks', split, rel))
    return sorted(orphans)


def _check_masks(data_root: str, items: dict, skip_masks: bool) -> bool:
    """Whether Binary-AUC can run: ``masks/`` exists and every image of the val split has
    its mask (else ``FileNotFoundError`` naming them, unless ``skip_masks``). Masks of no
    listed image are a warning naming them."""
    if skip_masks or not osp.isdir(osp.join(data_root, 'masks')):
        return False
    for split, lines in items.items():
        orphans = _orphan_masks(data_root, split, [rel for rel, _ in lines])
        if orphans:
            warnings.warn(f'{data_root}: {len(orphans)} mask(s) belong to no image of '
                          f'meta/{split}.txt and are not used: {_listed(orphans)}')
    if MASK_SPLIT not in items:
        return False
    rels = [rel for rel, _ in items[MASK_SPLIT]]
    missing = [osp.join(MASK_SPLIT, r) for r in rels
               if mask_path(data_root, MASK_SPLIT, r) is None]
    if missing:
        raise FileNotFoundError(
            f'{osp.join(data_root, "masks", MASK_SPLIT)}: {len(missing)} of {len(rels)} '
            f'{MASK_SPLIT} images have no mask: {_listed(missing)} (looked for the same '
            'relative path, or with .png, under masks/). Binary-AUC needs every mask: add them, '
            'or skip Binary-AUC explicitly (tools/demo.py --skip-binary-auc)')
    return True


def check_folder_layout(data_root: str, splits=SPLITS, skip_masks: bool = False) -> dict:
    """Check the documented layout up front; return ``dict(classes, num_images, has_masks)``.

    Args:
        data_root (str): the folder.
        splits (Sequence[str]): the splits to check. Defaults to ('train', 'val').
        skip_masks (bool): do not use ``masks/`` (no Binary-AUC) even if it exists.
            Defaults to False.

    Raises:
        FileNotFoundError: a missing file (``classes.txt``, an annotation file, an image) or,
            with ``masks/`` present, val images without a mask (named, with their count).
        ValueError: a bad line of an annotation file (file and line named), or a class of
            ``classes.txt`` without a train or a val image (named).

    A mask that belongs to no listed image is a warning naming it.
    """
    if not osp.isdir(data_root):
        raise FileNotFoundError(f'data folder {data_root} does not exist')
    classes = read_classes(data_root)
    items = {split: _read_split(data_root, split, len(classes)) for split in splits}
    _check_classes(data_root, classes, items)
    has_masks = _check_masks(data_root, items, skip_masks)
    return dict(classes=classes, num_images={k: len(v) for k, v in items.items()},
                has_masks=has_masks)


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
