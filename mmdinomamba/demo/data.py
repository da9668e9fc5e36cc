"""The demo's data: the generated embedded set, or a folder of your own in the same layout.

Your folder (see :mod:`mmdinomamba.datasets.folder`) is only read: nothing is written into,
regenerated in or deleted from it. Without ``masks/`` the Binary-AUC steps are skipped.
"""
import os.path as osp
import sys
from dataclasses import dataclass
from typing import List

from mmdinomamba.datasets.folder import check_folder_layout

__all__ = ['DemoData', 'prepare_data', 'loader_cfg']



@dataclass
class DemoData:
    """What the demo needs to know of its data folder.

    Attributes:
        root (str): absolute path. dataset_type (str): registered dataset class.
        classes (list[str]): class names (``classes.txt``). has_masks (bool): foreground masks
        for Binary-AUC. generated (bool): the embedded set made by this package.
        num_images (dict): images per split.
    """
    root: str
    dataset_type: str
    classes: List[str]
    has_masks: bool
    generated: bool
    num_images: dict


def prepare_data(root: str, generate: bool, overwrite: bool = False,
                 skip_masks: bool = False) -> DemoData:
    """Check (and, for the embedded set, generate) the data folder.

    Args:
        root (str): the data folder.
        generate (bool): ``root`` is the embedded data set: generate it when missing (logged).
            False: a folder of your own, read as it is.
        overwrite (bool): regenerate an embedded set made with other parameters.
        skip_masks (bool): no Binary-AUC, even with ``masks/`` (else every val image needs its
            mask: see :func:`~mmdinomamba.datasets.folder.check_folder_layout`).

    Returns:
        DemoData: the folder's description.
    """
    root = osp.abspath(root)
    if generate:
        from mmdinomamba.datasets.embedded import generate_embedded_dataset
        generate_embedded_dataset(root, progress=sys.stderr.isatty(), overwrite=overwrite,
                                  owner='demo')
    info = check_folder_layout(root, skip_masks=skip_masks)
    return DemoData(root=root, dataset_type='EmbeddedShapes' if generate else
                    'ImageFolderWithMasks', classes=info['classes'],
                    has_masks=info['has_masks'], generated=generate,
                    num_images=info['num_images'])


def loader_cfg(data: DemoData, split: str, img_size: int, with_mask: bool = False,
               batch_size: int = 120) -> dict:
    """An mmengine data loader config of a split, images resized to ``img_size`` (square)."""
    pipeline = [dict(type='LoadImageFromFile')]
    if with_mask:
        pipeline.append(dict(type='LoadFgMask', mask_format='binary'))
    pipeline += [dict(type='Resize', scale=(img_size, img_size)),
                 dict(type='PackInputs', algorithm_keys=['gt_seg_map'] if with_mask else [])]
    dataset = dict(type=data.dataset_type, data_root=data.root, split=split,
                   with_mask=with_mask, pipeline=pipeline)
    if data.generated:
        dataset['generate'] = False
    return dict(batch_size=batch_size, num_workers=0, dataset=dataset,
                sampler=dict(type='DefaultSampler', shuffle=False),
                collate_fn=dict(type='default_collate'))
