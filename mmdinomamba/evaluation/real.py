"""ImageNet-ReaL accuracy (Beyer et al., "Are we done with ImageNet?", 2020).

Each ILSVRC-2012 val image has a SET of plausible labels (``real.json``); a top-1 prediction is
correct when it is in that set. Images with an empty set (no valid label after reassessment) are
excluded from the average, as in the paper.
"""
from typing import List, Sequence, Tuple

import torch
from mmengine.evaluator import BaseMetric
from mmpretrain.registry import METRICS

__all__ = ['ReaLAccuracy']


@METRICS.register_module()
class ReaLAccuracy(BaseMetric):
    """Top-1 accuracy against multi-label ReaL annotations.

    Reads ``pred_score`` (K,) (or ``pred_label``) and ``real_labels`` (a list of class indices,
    put into the data sample by ``PackInputs(algorithm_keys=['real_labels'])``) per sample.
    Reports ``real/top1`` (percent over the images with labels), ``real/num_images`` (images
    counted) and ``real/num_excluded`` (images with an empty label list).

    Args:
        collect_device (str): Defaults to 'cpu'.
        prefix (str, optional): Defaults to 'real'.
    """
    default_prefix = 'real'

    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        for sample in data_samples:
            if 'real_labels' not in sample:
                raise KeyError("ReaLAccuracy: data sample has no 'real_labels'; use the "
                               "ImageNetReaL data set with PackInputs(algorithm_keys="
                               "['real_labels'])")
            if 'pred_score' in sample:
                pred = int(sample['pred_score'].argmax())
            else:
                pred = int(torch.as_tensor(sample['pred_label']).flatten()[0])
            self.results.append((pred, [int(c) for c in sample['real_labels']]))

    @staticmethod
    def calculate(preds: Sequence[int], real_labels: Sequence[Sequence[int]]) -> Tuple[float, int]:
        """Percent of images with a non-empty label set whose prediction is in the set.

        Returns:
            tuple: ``(accuracy in %, number of images counted)``; accuracy is NaN if none.
        """
        if len(preds) != len(real_labels):
            raise ValueError(f'{len(preds)} predictions but {len(real_labels)} label sets')
        hits = [int(p) in set(r) for p, r in zip(preds, real_labels) if len(r)]
        return (100. * sum(hits) / len(hits) if hits else float('nan')), len(hits)

    def compute_metrics(self, results: List[tuple]) -> dict:
        preds, reals = zip(*results) if results else ((), ())
        acc, used = self.calculate(preds, reals)
        return dict(top1=acc, num_images=used, num_excluded=len(results) - used)
