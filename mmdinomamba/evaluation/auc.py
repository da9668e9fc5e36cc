"""Binary-AUC: ROC AUC of a feature map against a foreground mask, vectorized over many maps.

Paper: "RNN as Linear Transformer: A Closer Investigation into Representational Potentials of
Visual Mamba Models", Sec. 4.1, Eq. 18-21.

Two estimators of the area under the ROC curve of ``score >= t`` against the foreground mask:

* :func:`exact_auc`: the exact area over *all* distinct scores, ties counted as 1/2 (the
  Mann-Whitney U statistic with mid-ranks). Equal to ``sklearn.metrics.roc_auc_score``.
* :func:`sweep_auc`: the paper's fixed sweep over ``num_thresholds`` thresholds
  ``t_k = k / (K - 1)`` in [0, 1] (Eq. 18-19), closed by the points (1, 1) (t = -inf) and (0, 0)
  (t = +inf), integrated with the trapezoid rule (Eq. 20). The thresholds assume maps already
  min-max normalized to [0, 1]. It converges to :func:`exact_auc` as ``num_thresholds`` grows
  (and equals it once every pair of distinct scores is separated by a threshold).

Both take ``scores (N, P)``, ``labels (N, P)`` (True = foreground) and an optional
``valid (N, P)`` (False = ignored pixel, e.g. ImageNet-S "ignore" = 1000) and return ``(N,)``
float64 AUCs, NaN for a map whose valid pixels are all foreground or all background.

Mask resizing to the patch grid (:func:`resize_mask`): ``'area'`` (default) averages the
foreground indicator over each patch's pixels (``adaptive_avg_pool2d``, so any image size works)
and marks a patch foreground when the fraction of foreground among its valid pixels is >= 0.5;
``'nearest'`` samples one pixel per patch.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = 255


def _as_inputs(scores: Tensor, labels: Tensor, valid: Optional[Tensor]):
    scores, labels = torch.as_tensor(scores), torch.as_tensor(labels)
    if scores.shape != labels.shape or scores.dim() != 2:
        raise ValueError(f'scores and labels must both be (N, P); got {tuple(scores.shape)} and '
                         f'{tuple(labels.shape)}')
    s = scores.detach()
    if not s.is_floating_point():
        s = s.to(torch.float64)
    y = labels.detach().bool().to(s.device)
    v = None if valid is None else torch.as_tensor(valid).bool().to(s.device)
    if v is not None and v.shape != y.shape:
        raise ValueError(f'valid must have the shape of labels {tuple(y.shape)}; '
                         f'got {tuple(v.shape)}')
    if not torch.isfinite(s if v is None else s[v]).all():
        raise ValueError('scores contain NaN or inf at valid positions')
    if v is None:
        return s, y, ~y, v
    return s, y & v, ~y & v, v


def exact_auc(scores: Tensor, labels: Tensor, valid: Optional[Tensor] = None) -> Tensor:
    """Exact ROC AUC per row via mid-ranks (Mann-Whitney U), ties counted as 1/2.

    Sorting is done in the scores' own floating dtype (order-exact); counts and sums in float64.

    Args:
        scores (Tensor): (N, P) map values.
        labels (Tensor): (N, P) bool, True = foreground (positive).
        valid (Tensor, optional): (N, P) bool, False = pixel ignored. Defaults to None (all).

    Returns:
        Tensor: (N,) float64 AUC; NaN where a row has no valid positive or no valid negative.
    """
    s, pos, neg, v = _as_inputs(scores, labels, valid)
    n, p = s.shape
    if v is not None:  # ignored pixels sort last, in groups of size 0
        s = torch.where(v, s, torch.full_like(s, float('inf')))
    key, order = torch.sort(s, dim=1)
    pos_sorted = torch.gather(pos, 1, order).to(torch.float64)
    new_group = torch.ones_like(key, dtype=torch.bool)
    new_group[:, 1:] = key[:, 1:] != key[:, :-1]
    group = new_group.cumsum(1) - 1  # (N, P) group id of each sorted element
    weight = torch.ones_like(pos_sorted) if v is None else torch.gather(v, 1, order).double()
    size = torch.zeros_like(pos_sorted).scatter_add_(1, group, weight)
    pos_count = torch.zeros_like(pos_sorted).scatter_add_(1, group, pos_sorted)
    start = size.cumsum(1) - size  # number of valid elements in earlier groups
    rank_sum = (pos_count * (start + (size + 1) / 2)).sum(1)  # sum of positive mid-ranks
    n_pos = pos.sum(1).to(torch.float64)
    n_neg = neg.sum(1).to(torch.float64)
    auc = (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return torch.where((n_pos > 0) & (n_neg > 0), auc, torch.full_like(auc, float('nan')))


def sweep_counts(scores: Tensor, labels: Tensor, valid: Optional[Tensor] = None,
                 num_thresholds: int = 101) -> Tuple[Tensor, Tensor, Tensor]:
    """TPR and FPR at the paper's thresholds ``t_k = k / (K - 1)`` (Eq. 18-19).

    Args:
        scores (Tensor): (N, P) maps, expected in [0, 1].
        labels (Tensor): (N, P) bool foreground.
        valid (Tensor, optional): (N, P) bool, False = ignored. Defaults to None.
        num_thresholds (int): K >= 2. Defaults to 101.

    Returns:
        tuple: thresholds (K,), tpr (N, K), fpr (N, K), ordered by increasing threshold.
    """
    if num_thresholds < 2:
        raise ValueError(f'num_thresholds must be >= 2, got {num_thresholds}')
    s, pos, neg, _ = _as_inputs(scores, labels, valid)
    s = s.to(torch.float64)
    t = torch.linspace(0, 1, num_thresholds, dtype=torch.float64, device=s.device)
    # bucket b = number of thresholds <= score; score >= t_k  <=>  k < b
    bucket = torch.searchsorted(t, s.contiguous(), right=True)
    rates = []
    for sel in (pos, neg):
        hist = torch.zeros(s.shape[0], num_thresholds + 1, dtype=torch.float64, device=s.device)
        hist.scatter_add_(1, bucket, sel.to(torch.float64))
        at_least = hist.flip(1).cumsum(1).flip(1)[:, 1:]  # (N, K): count of scores >= t_k
        rates.append(at_least / sel.sum(1, keepdim=True).to(torch.float64))
    return t, rates[0], rates[1]


def sweep_auc(scores: Tensor, labels: Tensor, valid: Optional[Tensor] = None,
              num_thresholds: int = 101) -> Tensor:
    """ROC AUC from the paper's fixed threshold sweep and the trapezoid rule (Eq. 20).

    The curve is closed with (FPR, TPR) = (1, 1) before the first and (0, 0) after the last
    threshold, so maps outside [0, 1] still give a complete curve.

    Args:
        scores (Tensor): (N, P) maps, expected min-max normalized to [0, 1].
        labels (Tensor): (N, P) bool foreground.
        valid (Tensor, optional): (N, P) bool, False = ignored. Defaults to None.
        num_thresholds (int): number of thresholds K in [0, 1]. Defaults to 101.

    Returns:
        Tensor: (N,) float64 AUC; NaN for rows without positives or negatives.
    """
    _, tpr, fpr = sweep_counts(scores, labels, valid, num_thresholds)
    ones = torch.ones_like(tpr[:, :1])
    tpr = torch.cat([ones, tpr, 0 * ones], dim=1)
    fpr = torch.cat([ones, fpr, 0 * ones], dim=1)
    return ((fpr[:, :-1] - fpr[:, 1:]) * (tpr[:, :-1] + tpr[:, 1:]) / 2).sum(1)


def normalize_auc(auc: Tensor) -> Tensor:
    """Eq. 21: ``max(AUC, 1 - AUC)`` (NaN stays NaN)."""
    return torch.maximum(auc, 1 - auc)


def roc_curve(scores: Tensor, labels: Tensor, valid: Optional[Tensor] = None
              ) -> Tuple[Tensor, Tensor]:
    """Exact ROC vertices of one map (for plots), from (0, 0) to (1, 1).

    Args:
        scores (Tensor): (P,) map values.
        labels (Tensor): (P,) bool foreground.
        valid (Tensor, optional): (P,) bool. Defaults to None.

    Returns:
        tuple: fpr (V,), tpr (V,) float64, one vertex per distinct score plus the origin.
    """
    valid = torch.ones_like(torch.as_tensor(labels), dtype=torch.bool) if valid is None else valid
    s, pos, neg, v = _as_inputs(scores[None], labels[None], valid[None])
    s, pos, neg = s[v].to(torch.float64), pos[v], neg[v]
    uniq, inv = torch.unique(s, sorted=True, return_inverse=True)
    hist_pos = torch.zeros_like(uniq).scatter_add_(0, inv, pos.double())
    hist_neg = torch.zeros_like(uniq).scatter_add_(0, inv, neg.double())
    tpr = hist_pos.flip(0).cumsum(0) / pos.sum().clamp_min(1)
    fpr = hist_neg.flip(0).cumsum(0) / neg.sum().clamp_min(1)
    zero = torch.zeros(1, dtype=torch.float64)
    return torch.cat([zero, fpr]), torch.cat([zero, tpr])


def minmax_normalize(maps: Tensor, dims: Tuple[int, ...] = (-2, -1),
                     eps: float = 1e-12) -> Tensor:
    """Min-max normalize each map to [0, 1] over ``dims`` (a constant map becomes all zeros).

    Args:
        maps (Tensor): (..., h, w) maps.
        dims (tuple[int]): dimensions that form one map. Defaults to (-2, -1).
        eps (float): floor of the range. Defaults to 1e-12.

    Returns:
        Tensor: same shape, values in [0, 1].
    """
    lo = maps.amin(dim=dims, keepdim=True)
    hi = maps.amax(dim=dims, keepdim=True)
    return (maps - lo) / (hi - lo).clamp_min(eps)


def resize_mask(mask: Tensor, size: Tuple[int, int], mode: str = 'area',
                ignore_index: int = IGNORE_INDEX, min_valid: float = 0.5
                ) -> Tuple[Tensor, Tensor]:
    """Resize a foreground mask to the patch grid.

    Args:
        mask (Tensor): (..., H, W) integer/bool mask: 1 (or True) foreground, 0 background,
            ``ignore_index`` ignored.
        size (tuple[int, int]): target grid (h, w).
        mode (str): ``'area'``: a patch is foreground when >= 50% of its valid pixels are
            (windows of ``adaptive_avg_pool2d``), valid when >= ``min_valid`` of its pixels are;
            ``'nearest'``: nearest-neighbour sample. Defaults to 'area'.
        ignore_index (int): ignored label. Defaults to 255.
        min_valid (float): minimum valid fraction of a patch in 'area' mode. Defaults to 0.5.

    Returns:
        tuple: fg (..., h, w) bool and valid (..., h, w) bool.
    """
    mask = torch.as_tensor(mask)
    lead = mask.shape[:-2]
    m = mask.reshape(-1, 1, *mask.shape[-2:]).long()
    valid = m != ignore_index
    fg = (m == 1) & valid
    if mode == 'area':
        v = F.adaptive_avg_pool2d(valid.double(), size)
        f = F.adaptive_avg_pool2d(fg.double(), size)
        out_valid = v >= min_valid
        out_fg = (f >= 0.5 * v) & out_valid
    elif mode == 'nearest':
        out = F.interpolate(m.double(), size=size, mode='nearest').long()
        out_valid = out != ignore_index
        out_fg = (out == 1) & out_valid
    else:
        raise ValueError(f"mask resize mode must be 'area' or 'nearest', got {mode!r}")
    return out_fg.reshape(*lead, *size), out_valid.reshape(*lead, *size)
