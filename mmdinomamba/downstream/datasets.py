"""The embedded data set seen as ADE20K-style segmentation and COCO-style instance data.

Both classes read the folders written by
:func:`mmdinomamba.datasets.embedded.generate_embedded_dataset` (``seg/`` and ``coco/``, see
``docs/CONTRACTS.md``), so the UperNet and Cascade Mask R-CNN pipelines run on CPU with no
download; they generate a missing data set only with ``generate=True``. An existing data set is
used with the sizes it was made with; it is never replaced unless ``overwrite=True``.

- :class:`EmbeddedShapesSeg` (mmseg ``DATASETS``): label maps hold 0 for background and ``k + 1``
  for shape class ``k``. Background is a real class here (index 0, ``reduce_zero_label=False``),
  unlike ADE20K where 0 means "ignore"; the ignore index stays 255.
- :class:`EmbeddedShapesCoco` (mmdet ``DATASETS``): a ``CocoDataset`` whose classes are the six
  shapes (category ids 1..6), boxes and polygon masks.
"""
from typing import Optional

from mmdet.datasets import CocoDataset
from mmdet.registry import DATASETS as DET_DATASETS
from mmseg.datasets import BaseSegDataset
from mmseg.registry import DATASETS as SEG_DATASETS

from mmdinomamba.datasets.embedded import prepare_embedded_data
from mmdinomamba.datasets.embedded_gen import CLASSES

SPLITS = dict(train='training', val='validation')
_PALETTE = [(0, 0, 0), (220, 20, 60), (0, 128, 255), (255, 200, 0), (60, 180, 75),
            (145, 30, 180), (240, 120, 40)]


def prepare_embedded_root(owner: str, data_root: str, split: str, generate: bool,
                          gen_kwargs: dict, kwargs: dict, overwrite: bool = False) -> None:
    """Check ``split`` and make sure the embedded data exist under ``data_root``.

    Args:
        owner (str): class name used in error messages.
        data_root (str): folder of the embedded data.
        split (str): ``'train'`` or ``'val'``.
        generate (bool): generate a missing data set (logged); with False a folder without
            ``meta.json`` raises ``FileNotFoundError``.
        gen_kwargs (dict): ``num_train``, ``num_val``, ``img_size``, ``seed``; None accepts
            the existing data set's value.
        kwargs (dict): the other dataset arguments; the file layout keys are fixed by ``split``.
        overwrite (bool): regenerate an existing data set made with other parameters than the
            given ones (otherwise that mismatch raises). Defaults to False.
    """
    if split not in SPLITS:
        raise ValueError(f"{owner}: split must be 'train' or 'val', got {split!r}")
    for key in ('ann_file', 'data_prefix', 'img_suffix', 'seg_map_suffix'):
        if key in kwargs:
            raise ValueError(f'{owner}: {key!r} is fixed by the embedded layout; choose the '
                             f'data with data_root and split instead (got {key}={kwargs[key]!r})')
    prepare_embedded_data(data_root, owner, generate, overwrite, **gen_kwargs)


@SEG_DATASETS.register_module()
class EmbeddedShapesSeg(BaseSegDataset):
    """Semantic segmentation view of the embedded data (ADE20K folder layout).

    Args:
        data_root (str): folder of the embedded data. Defaults to ``'data/embedded'``.
        split (str): ``'train'`` (``seg/*/training``) or ``'val'`` (``seg/*/validation``).
            Defaults to ``'train'``.
        generate (bool): generate the data if missing (logged). Defaults to False: a missing
            folder raises, naming the absolute folder and the command that makes it.
        overwrite (bool): regenerate an existing data set made with other generator parameters
            than the given ones. Defaults to False: such a mismatch raises, naming the folder,
            the parameters and both values.
        num_train, num_val, img_size, seed: generator parameters (see
            :func:`~mmdinomamba.datasets.embedded.generate_embedded_dataset`). None (default)
            accepts an existing data set as it is; a missing one gets the package defaults.
        **kwargs: passed to :class:`mmseg.datasets.BaseSegDataset` (``pipeline``, ...).
    """
    METAINFO = dict(classes=('background', ) + CLASSES, palette=_PALETTE)

    def __init__(self, data_root: str = 'data/embedded', split: str = 'train',
                 generate: bool = False, overwrite: bool = False,
                 num_train: Optional[int] = None, num_val: Optional[int] = None,
                 img_size: Optional[int] = None, seed: Optional[int] = None, **kwargs):
        prepare_embedded_root(type(self).__name__, data_root, split, generate,
                              dict(num_train=num_train, num_val=num_val, img_size=img_size,
                                   seed=seed), kwargs, overwrite)
        if kwargs.get('reduce_zero_label'):
            raise ValueError('EmbeddedShapesSeg: reduce_zero_label must be False (label 0 is '
                             'the background class, not "ignore")')
        kwargs['reduce_zero_label'] = False
        self.split = split
        super().__init__(
            data_root=data_root, img_suffix='.png', seg_map_suffix='.png',
            data_prefix=dict(img_path=f'seg/images/{SPLITS[split]}',
                             seg_map_path=f'seg/annotations/{SPLITS[split]}'), **kwargs)


@DET_DATASETS.register_module()
class EmbeddedShapesCoco(CocoDataset):
    """COCO-style instance view of the embedded data (boxes + polygon masks, 6 classes).

    Args:
        data_root (str): folder of the embedded data. Defaults to ``'data/embedded'``.
        split (str): ``'train'`` or ``'val'`` (``coco/annotations/instances_{split}.json`` with
            images in ``coco/{split}/``). Defaults to ``'train'``.
        generate (bool): generate the data if missing (logged). Defaults to False: a missing
            folder raises, naming the absolute folder and the command that makes it.
        overwrite (bool): regenerate an existing data set made with other generator parameters
            than the given ones. Defaults to False: such a mismatch raises, naming the folder,
            the parameters and both values.
        num_train, num_val, img_size, seed: generator parameters (see
            :func:`~mmdinomamba.datasets.embedded.generate_embedded_dataset`). None (default)
            accepts an existing data set as it is; a missing one gets the package defaults.
        **kwargs: passed to :class:`mmdet.datasets.CocoDataset` (``pipeline``, ``filter_cfg``,
            ``test_mode``, ...).
    """
    METAINFO = dict(classes=CLASSES, palette=_PALETTE[1:])

    def __init__(self, data_root: str = 'data/embedded', split: str = 'train',
                 generate: bool = False, overwrite: bool = False,
                 num_train: Optional[int] = None, num_val: Optional[int] = None,
                 img_size: Optional[int] = None, seed: Optional[int] = None, **kwargs):
        prepare_embedded_root(type(self).__name__, data_root, split, generate,
                              dict(num_train=num_train, num_val=num_val, img_size=img_size,
                                   seed=seed), kwargs, overwrite)
        self.split = split
        super().__init__(data_root=data_root,
                         ann_file=f'coco/annotations/instances_{split}.json',
                         data_prefix=dict(img=f'coco/{split}/'), **kwargs)
