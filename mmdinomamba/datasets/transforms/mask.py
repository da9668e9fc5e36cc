"""Load a foreground mask next to its image (for Binary-AUC).

The mask is stored in ``results['gt_seg_map']`` as ``uint8 (H, W)``: 1 foreground, 0 background,
255 ignored. Using the ``gt_seg_map`` key lets mmcv's geometric transforms (``Resize`` with nearest
interpolation for masks, ``CenterCrop``, ``RandomFlip``) keep it aligned with the image; pack it
with ``PackInputs(algorithm_keys=['gt_seg_map'])``.
"""
import os.path as osp

import numpy as np
from mmcv.transforms import BaseTransform
from mmpretrain.registry import TRANSFORMS
from PIL import Image

from .loading import named_load_error

IGNORE = 255
IMAGENET_S_IGNORE_ID = 1000
MASK_FORMATS = ('binary', 'imagenet_s')


def decode_fg_mask(array: np.ndarray, fmt: str) -> np.ndarray:
    """Turn a stored mask into the 0 / 1 / 255 foreground convention.

    Args:
        array (np.ndarray): decoded PNG, (H, W) or (H, W, C).
        fmt (str): ``'binary'``: 0 background, any non-zero foreground (0/255 PNGs);
            ``'imagenet_s'``: RGB class ids ``id = R + 256 * G`` (ImageNet-S), 0 = background
            ("other"), 1000 = ignore, any other id = foreground.

    Returns:
        np.ndarray: (H, W) uint8 mask.
    """
    if fmt == 'binary':
        m = array if array.ndim == 2 else array[..., 0]
        return (m > 0).astype(np.uint8)
    if fmt == 'imagenet_s':
        if array.ndim != 3 or array.shape[2] < 2:
            raise ValueError('ImageNet-S masks must be RGB (class id = R + 256 * G); got an '
                             f'array of shape {array.shape}')
        ids = array[..., 0].astype(np.int64) + 256 * array[..., 1].astype(np.int64)
        out = (ids > 0).astype(np.uint8)
        out[ids == IMAGENET_S_IGNORE_ID] = IGNORE
        return out
    raise ValueError(f'unknown fg mask format {fmt!r}; expected one of {MASK_FORMATS}')


@TRANSFORMS.register_module()
class LoadFgMask(BaseTransform):
    """Load the foreground mask of ``results['fg_mask_path']`` into ``results['gt_seg_map']``.

    Required keys: ``fg_mask_path``; optional ``fg_mask_format`` (overrides ``mask_format``),
    ``img`` (shape checked). Added keys: ``gt_seg_map`` (uint8 (H, W): 1 fg, 0 bg, 255 ignore).

    Args:
        mask_format (str): default stored format, ``'binary'`` or ``'imagenet_s'``.
            Defaults to 'binary'.
        check_size (bool): raise if the mask and the loaded image differ in size.
            Defaults to True.
    """

    def __init__(self, mask_format: str = 'binary', check_size: bool = True):
        if mask_format not in MASK_FORMATS:
            raise ValueError(f'LoadFgMask: mask_format must be one of {MASK_FORMATS}, '
                             f'got {mask_format!r}')
        self.mask_format = mask_format
        self.check_size = check_size

    def transform(self, results: dict) -> dict:
        path = results.get('fg_mask_path')
        if path is None:
            raise KeyError('LoadFgMask: the data info has no "fg_mask_path" (use a data set '
                           'with masks, e.g. EmbeddedShapes(with_mask=True) or ImageNetS)')
        if not osp.isfile(path):
            raise FileNotFoundError(f'LoadFgMask: mask file not found: {path}')
        fmt = results.get('fg_mask_format', self.mask_format)
        try:
            with Image.open(path) as im:
                array = np.asarray(im.convert('RGB') if fmt == 'imagenet_s' else im)
        except (OSError, SyntaxError, ValueError) as e:  # unreadable, truncated, not an image
            raise named_load_error('mask', path, e) from e
        try:
            mask = decode_fg_mask(array, fmt)
        except ValueError as e:
            raise ValueError(f'LoadFgMask: mask {path}: {e}') from e
        img = results.get('img')
        if self.check_size and img is not None and img.shape[:2] != mask.shape:
            raise ValueError(f'LoadFgMask: mask {path} has size {mask.shape} but the image '
                             f'{results.get("img_path")} has {img.shape[:2]}')
        results['gt_seg_map'] = mask
        return results

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}(mask_format={self.mask_format!r})'
