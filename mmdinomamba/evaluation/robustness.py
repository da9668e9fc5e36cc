"""Accuracy of a 1000-way classifier on a class subset (ImageNet-A / ImageNet-R, 200 classes).

The standard protocol (Hendrycks et al., 2021): keep only the logits of the subset's classes and
take the arg-max among them, i.e. the 1000-way head restricted to the 200 classes. Labels stay in
the ImageNet-1k index space (see ``mmdinomamba.datasets.ImageNetVariant``).
"""
from typing import List, Sequence

import torch
from mmengine.evaluator import BaseMetric
from mmpretrain.registry import METRICS
from torch import Tensor

from mmdinomamba.datasets.imagenet_variants import subset_indices

__all__ = ['RestrictedAccuracy', 'restrict_predictions']


def restrict_predictions(scores: Tensor, indices: Sequence[int], k: int = 1) -> Tensor:
    """Top-``k`` classes among ``indices`` only.

    Args:
        scores (Tensor): (N, K) scores over all K classes.
        indices (Sequence[int]): the allowed class indices (length S).
        k (int): how many. Defaults to 1.

    Returns:
        Tensor: (N, k) long, GLOBAL class indices (members of ``indices``), best first.
    """
    idx = torch.as_tensor(list(indices), dtype=torch.long, device=scores.device)
    return idx[scores[:, idx].topk(k, dim=1).indices]


@METRICS.register_module()
class RestrictedAccuracy(BaseMetric):
    """Top-k accuracy with the predictions restricted to a class subset.

    Reads ``pred_score`` (K,) and ``gt_label`` (a global index, which must be in the subset)
    of every data sample. Reports ``{prefix}/top{k}`` in percent.

    Args:
        subset (str | Sequence[str] | Sequence[int]): 'imagenet-a', 'imagenet-r', a list of
            wnids, or a list of class indices. Defaults to 'imagenet-a'.
        topk (Sequence[int]): Defaults to (1, ).
        collect_device (str): Defaults to 'cpu'.
        prefix (str, optional): Defaults to 'restricted'.
    """
    default_prefix = 'restricted'

    def __init__(self, subset='imagenet-a', topk: Sequence[int] = (1, ),
                 collect_device: str = 'cpu', prefix=None):
        super().__init__(collect_device=collect_device, prefix=prefix)
        if not isinstance(subset, str) and all(isinstance(i, int) for i in subset):
            self.indices = sorted(int(i) for i in subset)
        else:
            self.indices = subset_indices(subset)
        self.topk = tuple(topk)

    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        for sample in data_samples:
            gt = int(torch.as_tensor(sample['gt_label']).flatten()[0])
            self.results.append(dict(
                pred=restrict_predictions(sample['pred_score'].view(1, -1).cpu(), self.indices,
                                          max(self.topk))[0], gt=gt))

    def compute_metrics(self, results: List[dict]) -> dict:
        preds = torch.stack([r['pred'] for r in results])
        gts = torch.tensor([r['gt'] for r in results])
        bad = sorted(set(gts.tolist()) - set(self.indices))
        if bad:
            raise ValueError(f'RestrictedAccuracy: ground-truth classes {bad[:5]} are not in the '
                             f'subset of {len(self.indices)} classes')
        return {f'top{k}': (preds[:, :k] == gts[:, None]).any(1).float().mean().item() * 100
                for k in self.topk}
