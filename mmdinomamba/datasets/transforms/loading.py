"""Image loading whose errors name the file.

mmcv's ``LoadImageFromFile`` lets the decoder's error through as it is: a 0-byte or truncated
image gives a cv2 / Pillow error without the path, so a corrupt file among millions cannot be
found. The subclass below re-raises any loading error as ``OSError`` naming the file (the
original error is chained). It is registered as ``LoadImageFromFile`` in mmpretrain's registry
(replacing mmcv's entry there), so every pipeline of every mmpretrain-scoped config uses it
unchanged; ``mmdinomamba.downstream`` registers it for the mmseg and mmdet scopes.
"""
from typing import Optional

import mmpretrain.datasets.transforms  # noqa: F401  (mmpretrain's entries first, replaced below)
from mmcv.transforms import LoadImageFromFile as _MMCVLoadImageFromFile
from mmpretrain.registry import TRANSFORMS

__all__ = ['LoadImageFromFile', 'named_load_error']


def named_load_error(kind: str, path, error: BaseException) -> OSError:
    """An ``OSError`` that names the file that could not be loaded and what to do."""
    return OSError(f'cannot load {kind} {path}: {type(error).__name__}: {error}. The file is '
                   'empty, truncated or not an image: replace it (or remove it from the '
                   'annotation list).')


class LoadImageFromFile(_MMCVLoadImageFromFile):
    """mmcv's ``LoadImageFromFile`` (same arguments and results) whose errors name the file."""

    def transform(self, results: dict) -> Optional[dict]:
        try:
            return super().transform(results)
        except Exception as e:
            path = results.get('img_path')
            if path is None or str(path) in str(e):
                raise
            raise named_load_error('image', path, e) from e


TRANSFORMS.register_module(name='LoadImageFromFile', module=LoadImageFromFile, force=True)
