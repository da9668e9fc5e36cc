"""Evaluations of a frozen backbone over a data loader: features for k-NN / linear probes, and
Binary-AUC of its CLS-to-patch maps. Shared by the hooks, ``tools/`` and the demo.

Both run the backbone in eval mode under ``torch.no_grad()`` and restore its mode afterwards.
``preprocessor`` is an mmpretrain data preprocessor (``ClsDataPreprocessor``): it stacks,
converts BGR to RGB and normalizes what the loader's ``PackInputs`` produced.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor, nn

from mmdinomamba.evaluation.binary_auc import BinaryAUC, fill_featmap_samples
from .featmaps import compute_featmaps

__all__ = ['backbone_features', 'evaluate_binary_auc', 'sample_labels']


def sample_labels(data_samples) -> Tensor:
    """(B,) ground-truth labels of mmpretrain ``DataSample`` objects."""
    return torch.cat([s.gt_label.reshape(-1)[:1] for s in data_samples]).long()


class _eval_mode:
    """Put ``module`` in eval mode for a ``with`` block, then restore its mode."""

    def __init__(self, module: nn.Module):
        self.module = module

    def __enter__(self):
        self.was_training = self.module.training
        self.module.eval()

    def __exit__(self, *exc):
        self.module.train(self.was_training)


def _device(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


@torch.no_grad()
def backbone_features(backbone: nn.Module, loader, preprocessor: nn.Module
                      ) -> Tuple[Tensor, Tensor]:
    """The backbone's final feature (``backbone(x)[-1]``, e.g. the cls token) of every sample.

    Args:
        backbone (nn.Module): a backbone whose last output is (B, C).
        loader (Iterable): batches of ``dict(inputs, data_samples)`` with ``gt_label``.
        preprocessor (nn.Module): data preprocessor of the loader's batches.

    Returns:
        tuple: features (N, C) float32 on CPU and labels (N,).
    """
    feats, labels = [], []
    preprocessor = preprocessor.to(_device(backbone))
    with _eval_mode(backbone):
        for data in loader:
            data = preprocessor(data, False)
            out = backbone(data['inputs'])[-1]
            if out.dim() != 2:
                raise ValueError(f'backbone_features: the backbone output is {tuple(out.shape)}; '
                                 "need (B, C) (out_type='cls_token' or 'avg_featmap')")
            feats.append(out.float().cpu())
            labels.append(sample_labels(data['data_samples']))
    return torch.cat(feats), torch.cat(labels)


@torch.no_grad()
def evaluate_binary_auc(backbone: nn.Module, loader, preprocessor: nn.Module,
                        featmap_cfg: Optional[dict] = None, metric_cfg: Optional[dict] = None,
                        num_examples: int = 0) -> Tuple[dict, List[tuple]]:
    """Binary-AUC of the backbone's CLS-to-patch maps against the loader's foreground masks.

    Args:
        backbone (nn.Module): backbone with ``forward_layers`` (see ``compute_featmaps``).
        loader (Iterable): batches whose samples carry ``gt_seg_map`` (``LoadFgMask`` +
            ``PackInputs(algorithm_keys=['gt_seg_map'])``).
        preprocessor (nn.Module): data preprocessor of the batches.
        featmap_cfg (dict, optional): keyword arguments of ``compute_featmaps`` (``map_type``,
            ``layers``, ``query``, ``cosine_heads``, ``head_reduce``).
        metric_cfg (dict, optional): keyword arguments of :class:`BinaryAUC`.
        num_examples (int): keep the first few ``(image, maps, auc, featmaps)`` for figures.

    Returns:
        tuple: the metric dict of :class:`BinaryAUC` and the examples.
    """
    metric = BinaryAUC(**(metric_cfg or {}))
    examples, count = [], 0
    preprocessor = preprocessor.to(_device(backbone))
    with _eval_mode(backbone):
        for data in loader:
            data = preprocessor(data, False)
            fm = compute_featmaps(backbone, data['inputs'], **(featmap_cfg or {}))
            fill_featmap_samples(data['data_samples'], fm)
            start = len(metric.results)
            metric.process(data, data['data_samples'])
            count += len(data['data_samples'])
            for i in range(min(num_examples - len(examples), len(fm.maps))):
                examples.append((data['inputs'][i].cpu(), fm.maps[i].cpu(),
                                 metric.results[start + i]['auc'], fm))
    size = len(loader.dataset) if hasattr(loader, 'dataset') else count
    return metric.evaluate(size), examples
