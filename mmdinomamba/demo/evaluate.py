"""Frozen-backbone evaluations of the demo: k-NN and linear probe on the class labels,
Binary-AUC per layer on the foreground masks, and the pictures' raw material.

One function, :func:`evaluate_backbone`, runs all of them for one backbone (the DINO teacher or a
randomly initialized copy), so teacher and random init are measured the same way.
"""
import logging
from typing import Optional

import torch
from mmengine.logging import MMLogger
from mmengine.registry import init_default_scope
from mmengine.runner import Runner
from mmpretrain.registry import MODELS

from mmdinomamba.analysis.backbone_eval import backbone_features, evaluate_binary_auc
from mmdinomamba.evaluation.knn import knn_predict
from mmdinomamba.evaluation.logistic import fit_logistic_probe
from mmdinomamba.datasets.normalization import imagenet_preprocessor
from .data import DemoData, loader_cfg

__all__ = ['DemoLoaders', 'evaluate_backbone', 'build_backbone']

#: maps used for the demo's Binary-AUC: the CLS row of every layer's token-mixing matrix,
#: averaged over heads (DINO's attention-map recipe)
FEATMAP_CFG = dict(map_type='mixing', layers=None, head_reduce='mean')
#: the "stethoscope" (paper Figure 4(b)): every head of the last layer on its own
HEADS_CFG = dict(map_type='mixing', layers=(-1, ), head_reduce=None)


class DemoLoaders:
    """The evaluation loaders of a data folder at one image size, built once.

    Args:
        data (DemoData): the data folder.
        img_size (int): side the images are resized to.
        max_auc_images (int, optional): Binary-AUC on the first N val images (None: all).
    """

    def __init__(self, data: DemoData, img_size: int, max_auc_images: Optional[int] = None):
        init_default_scope('mmpretrain')
        self.data = data
        self.train = Runner.build_dataloader(loader_cfg(data, 'train', img_size))
        self.val = Runner.build_dataloader(loader_cfg(data, 'val', img_size))
        self.masks = None
        if data.has_masks:
            cfg = loader_cfg(data, 'val', img_size, with_mask=True)
            if max_auc_images:
                cfg['dataset']['indices'] = max_auc_images
            self.masks = Runner.build_dataloader(cfg)
        self.preprocessor = MODELS.build(imagenet_preprocessor())


def build_backbone(cfg: dict, checkpoint: Optional[str] = None, seed: int = 0,
                   prefix: str = 'teacher.backbone.'):
    """A backbone from its config: weights from ``checkpoint`` (keys under ``prefix``: a DINO
    checkpoint's teacher by default, ``'backbone.'`` for a classifier; or a backbone-only file;
    loaded strictly), else randomly initialized with ``seed``."""
    from mmdinomamba.models.utils.checkpoint import load_backbone_checkpoint
    torch.manual_seed(seed)
    backbone = MODELS.build(dict(cfg, init_cfg=None))
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)  # mmengine reports every parameter's init at INFO
    try:
        backbone.init_weights()
    finally:
        logger.setLevel(level)
    if checkpoint:
        load_backbone_checkpoint(backbone, checkpoint, prefix=prefix)
    return backbone.eval()


@torch.no_grad()
def evaluate_backbone(backbone, loaders: DemoLoaders, knn_k: int = 20,
                      knn_temperature: float = 0.07, probe_l2: float = 1e-3,
                      num_examples: int = 0) -> dict:
    """k-NN top-1, linear-probe top-1 (L-BFGS logistic regression on standardized features)
    and, with masks, Binary-AUC per layer (raw, %).

    Returns:
        dict: ``knn_top1``, ``linear_top1`` (%), ``probe_converged``, ``binary_auc`` (the
        :class:`BinaryAUC` metrics or None), ``binary_auc_heads`` (the metrics of every head of
        the last layer), ``examples`` and ``head_examples`` (for figures) and ``features``
        (train / val features and labels).
    """
    num_classes = len(loaders.data.classes)
    f_tr, y_tr = backbone_features(backbone, loaders.train, loaders.preprocessor)
    f_va, y_va = backbone_features(backbone, loaders.val, loaders.preprocessor)
    pred = knn_predict(f_tr, y_tr, f_va, num_classes, knn_k, knn_temperature)
    probe = fit_logistic_probe(f_tr, y_tr, num_classes, l2=probe_l2)
    out = dict(knn_top1=100. * float((pred == y_va).float().mean()),
               linear_top1=100. * float((probe.predict(f_va) == y_va).float().mean()),
               probe_converged=probe.converged, binary_auc=None, examples=[],
               features=dict(train=(f_tr, y_tr), val=(f_va, y_va)))
    if loaders.masks is not None:
        metrics, examples = evaluate_binary_auc(backbone, loaders.masks, loaders.preprocessor,
                                                FEATMAP_CFG, dict(), num_examples=num_examples)
        heads, head_examples = evaluate_binary_auc(backbone, loaders.masks,
                                                   loaders.preprocessor, HEADS_CFG, dict(),
                                                   num_examples=min(num_examples, 2))
        out.update(binary_auc=metrics, examples=examples, binary_auc_heads=heads,
                   head_examples=head_examples)
    return out
