"""PCA of patch features shown as RGB (paper Figures 6 and 12).

Per image, the patch features ``(h*w, C)`` are centered and projected on their first three
principal components; each component is min-max scaled to [0, 1] and used as one colour channel.
With ``bg_threshold`` (DINOv2's recipe) the first component, min-max scaled, separates background
(below the threshold, drawn black) from foreground, and the three components are then recomputed
on the foreground patches only. Signs are fixed so that each component's largest-magnitude
loading is positive (deterministic colours).
"""
from typing import Optional, Tuple

import torch
from torch import Tensor


def principal_components(x: Tensor, k: int = 3) -> Tuple[Tensor, Tensor]:
    """First ``k`` principal directions of centered rows.

    Args:
        x (Tensor): (N, C) samples.
        k (int): number of components. Defaults to 3.

    Returns:
        tuple: projections (N, k) and directions (k, C); missing components are zero.
    """
    x = x.double()
    xc = x - x.mean(0, keepdim=True)
    _, _, vh = torch.linalg.svd(xc, full_matrices=False)
    vh = vh[:k]
    sign = torch.sign(vh.gather(1, vh.abs().argmax(1, keepdim=True)))
    vh = vh * torch.where(sign == 0, torch.ones_like(sign), sign)
    if vh.shape[0] < k:
        vh = torch.cat([vh, vh.new_zeros(k - vh.shape[0], vh.shape[1])])
    return xc @ vh.T, vh


def _scale01(p: Tensor) -> Tensor:
    lo, hi = p.amin(0, keepdim=True), p.amax(0, keepdim=True)
    return (p - lo) / (hi - lo).clamp_min(1e-12)


def pca_rgb(patch_tokens: Tensor, hw: Tuple[int, int],
            bg_threshold: Optional[float] = None) -> Tensor:
    """RGB image of the first three PCA components of each image's patch features.

    Args:
        patch_tokens (Tensor): (B, h*w, C) patch features (raster order).
        hw (tuple[int, int]): patch grid (h, w).
        bg_threshold (float, optional): threshold on the min-max scaled first component below
            which a patch is background (black). Defaults to None (no removal).

    Returns:
        Tensor: (B, h, w, 3) float in [0, 1].
    """
    b, n, _ = patch_tokens.shape
    if n != hw[0] * hw[1]:
        raise ValueError(f'{n} patch tokens do not fill the grid {hw}')
    out = []
    for feats in patch_tokens:
        proj, _ = principal_components(feats, 3)
        rgb = _scale01(proj)
        if bg_threshold is not None:
            fg = rgb[:, 0] >= bg_threshold
            rgb = torch.zeros_like(rgb)
            if fg.sum() >= 2:
                rgb[fg] = _scale01(principal_components(feats[fg], 3)[0])
        out.append(rgb.reshape(*hw, 3))
    return torch.stack(out).float()
