"""The embedded default data set: written to disk in standard layouts, and its dataset class.

``generate_embedded_dataset`` writes, under one root, the same generated images in the layouts
that the real data sets use, so every pipeline (classification, DINO, Binary-AUC, ADE20K-style
segmentation, COCO-style detection) runs on it unchanged. See ``docs/CONTRACTS.md`` for the tree.

The folder is written into a hidden sibling and renamed into place, so an interrupted run never
leaves a half-written data set behind (the next run removes the scratch folder of a killed one).
Generation is always logged. An existing folder that is not ours is never touched, and an existing
embedded data set is never replaced by one with other parameters unless ``overwrite=True``.

Data are generated only where asked for: by ``generate_embedded_dataset`` (the demo,
``tools/misc/make_embedded_data.py``, test fixtures) or by a dataset built with
``generate=True``. A dataset pointed at a missing folder otherwise raises, naming the absolute
folder and the command that makes it, so that a config run from another working directory does
not fill that directory with images.
"""
import io
import json
import logging
import os
import os.path as osp
import re
import shlex
import shutil
import time
from typing import Optional

import numpy as np
from mmengine.logging import print_log
from mmpretrain.datasets import CustomDataset
from mmpretrain.registry import DATASETS
from PIL import Image

from ..utils.files import scratch_path, stale_scratch_target
from .embedded_gen import CLASSES, draw_sample

FORMAT_VERSION = 3
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


class EmbeddedDataMismatchError(ValueError):
    """An existing embedded data set was made with other parameters than the requested ones."""


def _log(msg: str, level: int = logging.INFO) -> None:
    print_log(msg, logger='current', level=level)


def _approx_mb(num_images: int, img_size: int) -> float:
    """Disk use in MB: 5 PNG files per image (about 6 bytes per pixel in all) plus file-system
    overhead (about 96 MB for the defaults; `du` shows about 94 MB)."""
    return num_images * (6 * img_size * img_size + 5 * 2048) / 2**20


def _folder_mb(folder: str) -> float:
    size = sum(osp.getsize(osp.join(d, f)) for d, _, files in os.walk(folder) for f in files)
    return size / 2**20


def _describe(value) -> str:
    if isinstance(value, list) and len(value) > 3:
        return f'{len(value)} names ({", ".join(map(str, value[:3]))}, ...)'
    return repr(value)


def _mismatch(root: str, meta: dict, params: dict, owner: str) -> Optional[str]:
    """The error message when ``meta`` (an existing data set) differs from ``params``."""
    diffs = [f'{key}: existing {_describe(meta.get(key))}, requested {_describe(value)}'
             for key, value in params.items() if meta.get(key) != value]
    if not diffs:
        return None
    return (f'{owner}: the embedded data set in {root} was made with other parameters '
            f'({"; ".join(diffs)}). It is not replaced without an explicit flag: pass '
            'overwrite=True (tools/misc/make_embedded_data.py --overwrite) to regenerate it, '
            'ask for the existing parameters, or choose another data_root.')


def _check_or_raise(root: str, meta: dict, params: dict, owner: str) -> None:
    msg = _mismatch(root, meta, params, owner)
    if msg is not None:
        raise EmbeddedDataMismatchError(msg)


def _remove_stale_scratch(root: str, legacy_age_s: float = 3600.) -> None:
    """Remove the hidden scratch folders of killed generations of ``root``.

    A scratch folder (``.<name>.partial-...`` or ``.<name>.old-...``, see
    :func:`~mmdinomamba.utils.files.scratch_path`) is stale when the process named in it (same
    host) no longer runs. Folders of the older ``.embedded-XXXXXXXX`` form carry no owner; they
    are removed when older than ``legacy_age_s`` seconds.
    """
    parent, name = osp.split(root)
    try:
        entries = os.listdir(parent)
    except FileNotFoundError:
        return
    for entry in entries:
        path = osp.join(parent, entry)
        if not osp.isdir(path):
            continue
        if re.match(r'^\.embedded-[A-Za-z0-9_]{8}$', entry):
            stale = time.time() - os.stat(path).st_mtime > legacy_age_s
        else:
            stale = stale_scratch_target(entry) == name
        if stale:
            _log(f'Removing {path}: left behind by an interrupted embedded data generation',
                 logging.WARNING)
            shutil.rmtree(path, ignore_errors=True)


def generate_embedded_dataset(root, num_train: int = DEFAULTS['num_train'],
                              num_val: int = DEFAULTS['num_val'],
                              img_size: int = DEFAULTS['img_size'], seed: int = DEFAULTS['seed'],
                              progress: bool = False, overwrite: bool = False,
                              owner: str = 'generate_embedded_dataset') -> str:
    """Write the embedded data set to ``root`` unless it is already there with these parameters.

    Generation is always logged (absolute path, image counts and size, disk use). The folder is
    written into a hidden sibling (``.<name>.partial-<host>-<pid>-<hex>``) and renamed into place,
    so an interrupted run never leaves a half-written data set; scratch folders of killed runs
    are removed by the next one. Folders are created with the usual permissions (umask).

    Args:
        root (str | Path): target folder. Created if missing. An existing embedded data set
            (``meta.json``) with these parameters is used as it is; one with other parameters
            raises :class:`EmbeddedDataMismatchError` (naming the folder, the parameters and
            both values) unless ``overwrite``. A non-empty folder that is not an embedded data
            set always raises ``FileExistsError``, so user data is never overwritten.
        num_train (int): training images. Defaults to 2400.
        num_val (int): validation images. Defaults to 480.
        img_size (int): square image side in pixels. Defaults to 64.
        seed (int): generator seed. Defaults to 0.
        progress (bool): show a progress bar. Defaults to False.
        overwrite (bool): replace an existing embedded data set made with other parameters.
            Defaults to False.
        owner (str): the caller's name in messages. Defaults to 'generate_embedded_dataset'.

    Returns:
        str: ``root`` (absolute).
    """
    root = osp.abspath(str(root))
    params = dict(version=FORMAT_VERSION, num_train=int(num_train), num_val=int(num_val),
                  img_size=int(img_size), seed=int(seed), classes=list(CLASSES))
    for key in ('num_train', 'num_val', 'img_size'):
        if params[key] < 1:
            raise ValueError(f'{owner}: {key} must be >= 1, got {params[key]}')
    meta = _read_meta(root)
    if meta == params:
        return root
    if meta is None and osp.isdir(root) and os.listdir(root):
        raise FileExistsError(
            f'{owner}: {root} exists and is not an embedded data set (no meta.json); refusing '
            'to write into it. Choose another data_root or remove the folder.')
    if meta is not None and not overwrite:
        _check_or_raise(root, meta, params, owner)
    num = params['num_train'] + params['num_val']
    what = 'Replacing the embedded data set' if meta is not None else \
        'Generating the embedded data set'
    _log(f'{what} at {root}: {params["num_train"]} train + {params["num_val"]} val images of '
         f'{img_size}x{img_size} px, seed {seed} (about {_approx_mb(num, img_size):.1f} MB on '
         'disk)', logging.WARNING)
    start = time.time()
    os.makedirs(osp.dirname(root), exist_ok=True)
    _remove_stale_scratch(root)
    tmp = scratch_path(root, 'partial')
    os.mkdir(tmp)
    try:
        for split, ade_split in SPLITS:
            coco = _write_split(tmp, split, ade_split, params[f'num_{split}'], img_size, seed,
                                progress)
            _write(osp.join(tmp, 'coco', 'annotations', f'instances_{split}.json'),
                   json.dumps(coco).encode())
        _write(osp.join(tmp, 'classes.txt'), ('\n'.join(CLASSES) + '\n').encode())
        _write(osp.join(tmp, 'meta.json'), json.dumps(params, indent=1).encode())
        size_mb = _folder_mb(tmp)
        _swap_into_place(tmp, root, params, overwrite, owner)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _log(f'Embedded data set ready at {root}: {num} images, {size_mb:.1f} MB of files, '
         f'{time.time() - start:.1f} s')
    return root


def _swap_into_place(tmp: str, root: str, params: dict, overwrite: bool, owner: str) -> None:
    """Rename ``tmp`` to ``root``; with ``overwrite`` an old embedded set is moved aside first,
    then removed. If another process wrote ``root`` meanwhile, its copy is kept when it has our
    parameters."""
    old = None
    existing = _read_meta(root)
    if existing is not None and existing != params:
        if not overwrite:
            _check_or_raise(root, existing, params, owner)
        old = scratch_path(root, 'old')
        os.rename(root, old)
    try:
        os.rename(tmp, root)
    except OSError:
        existing = _read_meta(root)
        if existing is None:
            raise
        _check_or_raise(root, existing, params, owner)  # another process finished first
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def make_data_command(data_root: str, **params) -> str:
    """The command line that writes the embedded data set ``data_root`` with ``params`` (the
    ones that differ from the package defaults), for error messages."""
    package = osp.dirname(osp.dirname(osp.abspath(__file__)))
    tool = osp.realpath(osp.join(package, '.mim', 'tools', 'misc', 'make_embedded_data.py'))
    if not osp.isfile(tool):
        tool = 'tools/misc/make_embedded_data.py'
    words = ['python', tool, '--root', osp.abspath(data_root)]
    for key, value in params.items():
        if value is not None and value != DEFAULTS.get(key):
            words += [f'--{key.replace("_", "-")}', str(value)]
    return ' '.join(shlex.quote(w) for w in words)


def missing_data_error(data_root: str, owner: str, **params) -> FileNotFoundError:
    """The error for a missing embedded data set: the resolved folder, the working directory a
    relative ``data_root`` was resolved against, and the two ways to make the data."""
    where = osp.abspath(data_root)
    relative = '' if osp.isabs(data_root) else \
        f' (data_root={data_root!r} resolved against the working directory {os.getcwd()})'
    return FileNotFoundError(
        f'{owner}: no embedded data set at {where}{relative}: no meta.json there. Data are '
        'generated only when '
        f'asked for: run `{make_data_command(data_root, **params)}`, or build the data set '
        'with generate=True (in a config: --cfg-options train_dataloader.dataset.generate=True '
        'and likewise for the other loaders), or point data_root at an existing data set.')


def prepare_embedded_data(data_root: str, owner: str, generate: bool = False,
                          overwrite: bool = False, **params) -> dict:
    """Make sure the embedded data set under ``data_root`` exists and matches ``params``.

    Used by the dataset classes. A parameter given as None accepts the existing data set's
    value (the package default when the data set is missing); a given value that differs from
    the existing one raises :class:`EmbeddedDataMismatchError` unless ``overwrite``.

    Args:
        data_root (str): folder of the embedded data.
        owner (str): class name used in messages.
        generate (bool): generate a missing data set (logged: path, size). With False
            (default) a folder without ``meta.json`` raises ``FileNotFoundError`` naming the
            absolute folder and the command that makes it.
        overwrite (bool): regenerate an existing data set made with other parameters (an
            explicit request: it needs no ``generate``). Defaults to False.
        **params: ``num_train``, ``num_val``, ``img_size``, ``seed`` (int or None).

    Returns:
        dict: the data set's ``meta.json``.
    """
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise TypeError(f'{owner}: unknown generator parameter(s) {sorted(unknown)}; expected '
                        f'{sorted(DEFAULTS)}')
    meta = _read_meta(data_root)
    if meta is None and not generate:
        raise missing_data_error(data_root, owner, **params)
    base = DEFAULTS if meta is None else {k: meta.get(k, v) for k, v in DEFAULTS.items()}
    full = {k: base[k] if params.get(k) is None else params[k] for k in DEFAULTS}
    if meta is not None:
        requested = dict(version=FORMAT_VERSION, classes=list(CLASSES), **full)
        if _mismatch(data_root, meta, requested, owner) is None:
            return meta
        if not overwrite:
            _check_or_raise(osp.abspath(data_root), meta, requested, owner)
    generate_embedded_dataset(data_root, **full, overwrite=overwrite, owner=owner)
    return _read_meta(data_root)


@DATASETS.register_module()
class EmbeddedShapes(CustomDataset):
    """Classification view of the embedded data set.

    Args:
        data_root (str): folder of the embedded data. Defaults to ``'data/embedded'``.
        split (str): ``'train'`` or ``'val'``. Defaults to ``'train'``.
        with_mask (bool): add ``fg_mask_path`` (binary foreground PNG) to every data info.
            Defaults to False.
        generate (bool): generate the data if missing (logged: absolute path, image counts,
            size). With False (default) a missing folder raises ``FileNotFoundError`` naming
            the absolute folder and the command that makes it.
        overwrite (bool): regenerate an existing data set made with other generator
            parameters than the given ones. Defaults to False: such a mismatch raises
            :class:`EmbeddedDataMismatchError` naming the folder, the parameters and both values.
        num_train, num_val, img_size, seed: generator parameters (see
            :func:`generate_embedded_dataset`). None (default) accepts an existing data set as
            it is and generates a missing one with the package defaults.
        **kwargs: passed to :class:`mmpretrain.datasets.CustomDataset` (``pipeline``, ...).
    """

    def __init__(self, data_root: str = 'data/embedded', split: str = 'train',
                 with_mask: bool = False, generate: bool = False, overwrite: bool = False,
                 num_train: Optional[int] = None, num_val: Optional[int] = None,
                 img_size: Optional[int] = None, seed: Optional[int] = None, **kwargs):
        if split not in ('train', 'val'):
            raise ValueError(f"EmbeddedShapes: split must be 'train' or 'val', got {split!r}")
        prepare_embedded_data(data_root, type(self).__name__, generate, overwrite,
                              num_train=num_train, num_val=num_val, img_size=img_size, seed=seed)
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
