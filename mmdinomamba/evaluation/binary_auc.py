"""The Binary-AUC metric (paper Sec. 4.1) as an mmengine ``BaseMetric``.

Each data sample must carry ``pred_featmap`` (num_layers, heads, R, h, w): maps min-max normalized
to [0, 1] per map, optional metainfo ``featmap_layers`` (layer index of each row), both written by
:func:`fill_featmap_samples` (for the ``FeatMapEvaluator`` model and ``BinaryAUCHook``), and
``gt_seg_map`` (H, W): 1 foreground,
0 background, 255 ignored (:class:`LoadFgMask`). The mask is resized to the map grid with
:func:`~mmdinomamba.evaluation.auc.resize_mask` (``'area'``: a patch is foreground when at least
half of its valid pixels are). Reported values are in percent, averaged over images; images whose
resized mask is all foreground or all background are skipped and counted (``skipped``).
"""
from collections import defaultdict
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from mmengine.evaluator import BaseMetric
from mmengine.logging import MMLogger
from mmpretrain.registry import METRICS

from .auc import exact_auc, normalize_auc, resize_mask, sweep_auc


def fill_featmap_samples(data_samples: Sequence, featmaps) -> Sequence:
    """Write a batch of feature maps into its data samples: the fields :class:`BinaryAUC` reads.

    Every sample gets ``pred_featmap`` (num_layers, heads, R, h, w) (float32, CPU) and the
    metainfo ``featmap_layers`` (layer of each row), ``featmap_type`` ('mixing' / 'cosine') and
    ``query_index`` (token position of each of the R queries).

    Args:
        data_samples (Sequence[DataSample]): one per image of the batch.
        featmaps: the batch's :class:`~mmdinomamba.analysis.featmaps.FeatMaps` (``maps``
            (B, num_layers, heads, R, h, w), ``layers``, ``map_type``, ``query_index``).

    Returns:
        Sequence[DataSample]: ``data_samples``, filled in place.
    """
    if len(data_samples) != len(featmaps.maps):
        raise ValueError(f'fill_featmap_samples: {len(data_samples)} data samples for '
                         f'{len(featmaps.maps)} maps')
    meta = dict(featmap_layers=featmaps.layers, featmap_type=featmaps.map_type,
                query_index=featmaps.query_index)
    for sample, maps in zip(data_samples, featmaps.maps):
        sample.set_field(maps.detach().float().cpu(), 'pred_featmap')
        sample.set_metainfo(meta)
    return data_samples


def _get(sample, key):
    value = sample.get(key) if hasattr(sample, 'get') else getattr(sample, key, None)
    if value is None:
        raise KeyError(f'BinaryAUC: data sample has no {key!r}; evaluate with the '
                       "FeatMapEvaluator model and a pipeline with LoadFgMask + "
                       "PackInputs(algorithm_keys=['gt_seg_map'])")
    return value


@METRICS.register_module()
class BinaryAUC(BaseMetric):
    """Binary-AUC of CLS-to-patch feature maps against foreground masks.

    Args:
        num_thresholds (int, optional): None for the exact AUC over all distinct scores (ties
            count 1/2), or the number of thresholds of the paper's fixed sweep over [0, 1].
            Defaults to None.
        mask_resize (str): 'area' or 'nearest' (see ``resize_mask``). Defaults to 'area'.
        min_valid (float): minimum fraction of non-ignored pixels for a patch to count.
            Defaults to 0.5.
        layer_head (bool): also report every (layer, head) pair. Defaults to False.
        collect_device (str): 'cpu' or 'gpu'. Defaults to 'cpu'.
        prefix (str, optional): key prefix. Defaults to 'binary_auc'.
    """
    default_prefix = 'binary_auc'

    def __init__(self, num_thresholds: Optional[int] = None, mask_resize: str = 'area',
                 min_valid: float = 0.5, layer_head: bool = False,
                 collect_device: str = 'cpu', prefix: Optional[str] = None):
        super().__init__(collect_device=collect_device, prefix=prefix)
        if num_thresholds is not None and num_thresholds < 2:
            raise ValueError(f'BinaryAUC: num_thresholds must be None or >= 2, '
                             f'got {num_thresholds}')
        if mask_resize not in ('area', 'nearest'):
            raise ValueError(f"BinaryAUC: mask_resize must be 'area' or 'nearest', "
                             f'got {mask_resize!r}')
        self.num_thresholds = num_thresholds
        self.mask_resize = mask_resize
        self.min_valid = min_valid
        self.layer_head = layer_head

    @staticmethod
    def calculate(maps, masks, num_thresholds: Optional[int] = None,
                  valid=None) -> Dict[str, torch.Tensor]:
        """AUC of many maps at once.

        Args:
            maps (Tensor | np.ndarray): (N, ...) maps; trailing dims are flattened.
            masks (Tensor | np.ndarray): (N, ...) foreground (True / 1), same shape.
            num_thresholds (int, optional): None = exact AUC; else the paper's sweep with this
                many thresholds in [0, 1] (maps should be min-max normalized). Defaults to None.
            valid (Tensor | np.ndarray, optional): (N, ...) False = ignored pixel.

        Returns:
            dict: ``auc`` (N,) raw AUC, ``auc_norm`` (N,) ``max(AUC, 1 - AUC)``, ``skipped`` (N,)
            bool (mask all foreground or all background; AUC is NaN there). float64 tensors.
        """
        maps = torch.as_tensor(np.asarray(maps) if not torch.is_tensor(maps) else maps)
        n = maps.shape[0]
        scores = maps.reshape(n, -1)
        labels = torch.as_tensor(masks).reshape(n, -1).bool()
        if valid is not None:
            valid = torch.as_tensor(valid).reshape(n, -1).bool()
        if num_thresholds is None:
            auc = exact_auc(scores, labels, valid)
        else:
            auc = sweep_auc(scores, labels, valid, num_thresholds)
        return dict(auc=auc, auc_norm=normalize_auc(auc), skipped=torch.isnan(auc))

    def process(self, data_batch, data_samples: Sequence) -> None:
        """Compute the AUC of every map of every sample (one vectorized call per batch)."""
        groups = defaultdict(list)
        for i, sample in enumerate(data_samples):
            maps = torch.as_tensor(_get(sample, 'pred_featmap')).float().cpu()
            if maps.dim() != 5:
                raise ValueError('BinaryAUC: pred_featmap must be (num_layers, heads, R, h, w), '
                                 f'got shape {tuple(maps.shape)}')
            seg = torch.as_tensor(np.asarray(_get(sample, 'gt_seg_map')))
            fg, valid = resize_mask(seg, tuple(maps.shape[-2:]), self.mask_resize,
                                    min_valid=self.min_valid)
            groups[tuple(maps.shape)].append((i, maps, fg, valid))
        out = [None] * len(data_samples)
        for shape, items in groups.items():
            k = int(np.prod(shape[:3]))
            maps = torch.stack([m for _, m, _, _ in items]).reshape(-1, *shape[-2:])
            fg = torch.stack([f for _, _, f, _ in items]).repeat_interleave(k, 0)
            valid = torch.stack([v for _, _, _, v in items]).repeat_interleave(k, 0)
            res = self.calculate(maps, fg, self.num_thresholds, valid)
            aucs = res['auc'].reshape(len(items), *shape[:3]).numpy()
            for (i, *_), auc in zip(items, aucs):
                out[i] = auc
        for sample, auc in zip(data_samples, out):
            layers = sample.get('featmap_layers') if hasattr(sample, 'get') else None
            layers = list(range(auc.shape[0])) if layers is None else list(layers)
            self.results.append(dict(auc=auc, skipped=bool(np.isnan(auc).all()),
                                     layers=layers))

    def compute_metrics(self, results: List[dict]) -> Dict[str, float]:
        """Mean over non-skipped images (in %), with per-layer/head/register breakdowns."""
        kept = [r for r in results if not r['skipped']]
        metrics = dict(num_images=len(results), skipped=len(results) - len(kept))
        if not kept:
            MMLogger.get_current_instance().warning(
                f'BinaryAUC: every image ({len(results)} of {len(results)}) was skipped (masks '
                'all foreground or all background): the AUC is NaN')
            return dict(metrics, auc=float('nan'), auc_norm=float('nan'))
        shapes = {r['auc'].shape for r in kept}
        if len(shapes) > 1:
            raise ValueError(f'BinaryAUC: samples have different map layouts {shapes}')
        raw = np.stack([r['auc'] for r in kept]) * 100  # (n, layers, heads, R)
        norm = np.maximum(raw, 100 - raw)
        layers = kept[0]['layers']
        method = 'exact' if self.num_thresholds is None else f'{self.num_thresholds} thresholds'
        MMLogger.get_current_instance().info(
            f'BinaryAUC ({method}, mask resize {self.mask_resize!r}, maps min-max normalized '
            f'per image) over {len(kept)} images, {len(results) - len(kept)} skipped')
        for name, arr in (('auc', raw), ('auc_norm', norm)):
            metrics[name] = float(arr.mean())
            nl, nh, nr = arr.shape[1:]
            if nl > 1:
                for i, layer in enumerate(layers):
                    metrics[f'{name}/layer_{layer}'] = float(arr[:, i].mean())
            if nh > 1:
                for h in range(nh):
                    metrics[f'{name}/head_{h}'] = float(arr[:, :, h].mean())
            if nr > 1:
                for r in range(nr):
                    metrics[f'{name}/reg_{r}'] = float(arr[:, :, :, r].mean())
            if self.layer_head and nh > 1:
                for i, layer in enumerate(layers):
                    for h in range(nh):
                        metrics[f'{name}/layer_{layer}_head_{h}'] = float(arr[:, i, h].mean())
        return metrics
