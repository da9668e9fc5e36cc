"""The embedded default data set: written to disk in standard layouts, and its dataset class.

``generate_embedded_dataset`` writes, under one root, the same generated images in the layouts
that the real data sets use, so every pipeline (classification, DINO, Binary-AUC, ADE20K-style
segmentation, COCO-style detection) runs on it unchanged. See ``docs/CONTRACTS.md`` for the tree.

The folder is written into a temporary sibling and renamed into place, so an interrupted run never
leaves a half-written data set behind, and an existing folder that is not ours is never touched.
"""
import io
import json
import os
import os.path as osp
import shutil
import tempfile
from typing import Optional

import numpy as np
from mmpretrain.datasets import CustomDataset
from mmpretrain.registry import DATASETS
from PIL import Image

from .embedded_gen import CLASSES, draw_sample

FORMAT_VERSION = 1
DEFAULTS = dict(num_train=2400, num_val=480, img_size=64, seed=0)
SPLITS = (('train', 'training'), ('val', 'validation'))


def _png_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format='PNG')
    return buf.getvalue()


def _write(path: str, data: bytes) -> None:
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
        f.write(data)


def _write_split(tmp: str, split: str, ade_split: str, num: int, img_size: int, seed: int,
                 progress: bool) -> dict:
    """Write one split in every layout; return its COCO annotation dict."""
    coco = dict(images=[], annotations=[],
                categories=[dict(id=i + 1, name=c) for i, c in enumerate(CLASSES)])
    lines = []
    indices = range(num)
    if progress:
        from tqdm import tqdm
        indices = tqdm(indices, desc=f'embedded {split}', leave=False)
    for i in indices:
        s = draw_sample(seed, 0 if split == 'train' else 1, i, img_size)
        name = f'{split}_{i:05d}.png'
        rel = f'{CLASSES[s.label]}/{name}'
        img = _png_bytes(s.image)
        _write(osp.join(tmp, split, rel), img)
        _write(osp.join(tmp, 'masks', split, rel), _png_bytes(s.fg_mask.astype(np.uint8) * 255))
        _write(osp.join(tmp, 'seg', 'images', ade_split, name), img)
        _write(osp.join(tmp, 'seg', 'annotations', ade_split, name), _png_bytes(s.semantic))
        _write(osp.join(tmp, 'coco', split, name), img)
        lines.append(f'{rel} {s.label}')
        coco['images'].append(dict(id=i + 1, file_name=name, height=img_size, width=img_size))
        for inst in s.instances:
            coco['annotations'].append(
                dict(id=len(coco['annotations']) + 1, image_id=i + 1, category_id=inst.label + 1,
                     bbox=list(inst.bbox), area=float(inst.mask.sum()), iscrowd=0,
                     segmentation=[inst.polygon]))
    _write(osp.join(tmp, 'meta', f'{split}.txt'), ('\n'.join(lines) + '\n').encode())
    return coco


def _read_meta(root: str) -> Optional[dict]:
    path = osp.join(root, 'meta.json')
    if not osp.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def generate_embedded_dataset(root, num_train: int = DEFAULTS['num_train'],
                              num_val: int = DEFAULTS['num_val'],
                              img_size: int = DEFAULTS['img_size'], seed: int = DEFAULTS['seed'],
                              progress: bool = False) -> str:
    """Write the embedded data set to ``root`` if it is not already there with these parameters.

    Args:
        root (str | Path): target folder. Created if missing. If it exists, it must be an embedded
            data set (have ``meta.json``): one with other parameters is replaced; anything else
            raises, so user data is never overwritten.
        num_train (int): training images. Defaults to 2400.
        num_val (int): validation images. Defaults to 480.
        img_size (int): square image side in pixels. Defaults to 64.
        seed (int): generator seed. Defaults to 0.
        progress (bool): show a progress bar. Defaults to False.

    Returns:
        str: ``root``.
    """
    root = osp.abspath(str(root))
    params = dict(version=FORMAT_VERSION, num_train=int(num_train), num_val=int(num_val),
                  img_size=int(img_size), seed=int(seed), classes=list(CLASSES))
    for key in ('num_train', 'num_val', 'img_size'):
        if params[key] < 1:
            raise ValueError(f'generate_embedded_dataset: {key} must be >= 1, got {params[key]}')
    meta = _read_meta(root)
    if meta == params:
        return root
    if meta is None and osp.isdir(root) and os.listdir(root):
        raise FileExistsError(
            f'{root} exists and is not an embedded data set (no meta.json); refusing to write '
            'into it. Choose another data_root or remove the folder.')
    parent = osp.dirname(root)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix='.embedded-', dir=parent)
    try:
        for split, ade_split in SPLITS:
            coco = _write_split(tmp, split, ade_split, params[f'num_{split}'], img_size, seed,
                                progress)
            _write(osp.join(tmp, 'coco', 'annotations', f'instances_{split}.json'),
                   json.dumps(coco).encode())
        _write(osp.join(tmp, 'classes.txt'), ('\n'.join(CLASSES) + '\n').encode())
        _write(osp.join(tmp, 'meta.json'), json.dumps(params, indent=1).encode())
        _swap_into_place(tmp, root, params)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _swap_into_place(tmp: str, root: str, params: dict) -> None:
    """Rename ``tmp`` to ``root``; an old embedded set is moved aside first, then removed."""
    old = None
    if osp.isdir(root):
        old = tmp + '.old'
        os.rename(root, old)
    try:
        os.rename(tmp, root)
    except OSError:
        # Another process finished first: keep its copy if it has our parameters.
        if _read_meta(root) != params:
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@DATASETS.register_module()
class EmbeddedShapes(CustomDataset):
    """Classification view of the embedded data set (generated on first use).

    Args:
        data_root (str): folder of the embedded data. Defaults to ``'data/embedded'``.
        split (str): ``'train'`` or ``'val'``. Defaults to ``'train'``.
        with_mask (bool): add ``fg_mask_path`` (binary foreground PNG) to every data info.
            Defaults to False.
        generate (bool): generate the data if missing (or, when generator parameters are
            given, made with other ones). With False a missing folder raises
            ``FileNotFoundError``. Defaults to True.
        num_train, num_val, img_size, seed: generator parameters (see
            :func:`generate_embedded_dataset`). None (default) accepts an existing data set as
            it is and generates a missing one with the package defaults; a given value that
            differs from the existing data set's regenerates it.
        **kwargs: passed to :class:`mmpretrain.datasets.CustomDataset` (``pipeline``, ...).
    """

    def __init__(self, data_root: str = 'data/embedded', split: str = 'train',
                 with_mask: bool = False, generate: bool = True,
                 num_train: Optional[int] = None, num_val: Optional[int] = None,
                 img_size: Optional[int] = None, seed: Optional[int] = None, **kwargs):
        if split not in ('train', 'val'):
            raise ValueError(f"EmbeddedShapes: split must be 'train' or 'val', got {split!r}")
        params = dict(num_train=num_train, num_val=num_val, img_size=img_size, seed=seed)
        existing = _read_meta(data_root)
        if generate and (existing is None or any(v is not None for v in params.values())):
            params = {k: DEFAULTS[k] if v is None else v for k, v in params.items()}
            generate_embedded_dataset(data_root, **params)
        elif existing is None:
            raise FileNotFoundError(
                f'EmbeddedShapes: no embedded data set at data_root={data_root!r} (meta.json '
                'missing); create it with `python tools/misc/make_embedded_data.py` or set '
                'generate=True')
        self.split = split
        self.with_mask = with_mask
        super().__init__(data_root=data_root, data_prefix=split, ann_file=f'meta/{split}.txt',
                         classes=osp.join(data_root, 'classes.txt'), **kwargs)

    def load_data_list(self):
        data_list = super().load_data_list()
        if self.with_mask:
            img_root = osp.join(self.data_root, self.split)
            mask_root = osp.join(self.data_root, 'masks', self.split)
            for info in data_list:
                info['fg_mask_path'] = osp.join(mask_root, osp.relpath(info['img_path'], img_root))
        return data_list
