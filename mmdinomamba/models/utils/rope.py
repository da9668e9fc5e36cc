"""2-D rotary position embedding (RoPE) for any ``H x W`` token grid.

The layout follows MILA (LeapLabTHU/MLLA, ``RoPE``): a feature of width ``D`` (``D % 4 == 0``) is
read as ``D / 2`` complex numbers ``(x[2i], x[2i+1])``. With ``k = D / 4`` frequencies
``theta_f = base ** (-f / k)``, the first ``k`` pairs are rotated by ``row * theta_f`` and the next
``k`` pairs by ``col * theta_f``. Each pair is a plane rotation, so

* the norm of every feature is preserved, and
* ``<R(m) q, R(n) k>`` depends only on the offset ``m - n`` of the two grid positions.

Unlike the original, the angles are built at run time for the actual ``(H, W)``, so any (also
non-square, odd) grid works.
"""
from typing import Tuple

import torch
from torch import Tensor

__all__ = ['rope_2d_cos_sin', 'apply_rope_2d']


def rope_2d_cos_sin(hw: Tuple[int, int], dim: int, base: float = 10000.,
                    device=None, dtype=torch.float32) -> Tuple[Tensor, Tensor]:
    """Cosines and sines of the 2-D RoPE angles of a raster-ordered grid.

    Args:
        hw (tuple[int, int]): grid ``(H, W)``.
        dim (int): feature width ``D``; must be a positive multiple of 4.
        base (float): frequency base. Defaults to 10000.
        device: device of the result. Defaults to None (CPU).
        dtype: dtype of the result. Defaults to float32.

    Returns:
        tuple[Tensor, Tensor]: ``cos`` and ``sin``, each (H * W, D / 2), row ``i * W + j`` for
        grid position ``(i, j)``.
    """
    if dim <= 0 or dim % 4:
        raise ValueError(f'RoPE feature width must be a positive multiple of 4, got {dim}')
    h, w = (int(s) for s in hw)
    k = dim // 4
    theta = base**(-torch.arange(k, device=device, dtype=torch.float64) / k)  # (k,)
    rows = torch.arange(h, device=device, dtype=torch.float64)
    cols = torch.arange(w, device=device, dtype=torch.float64)
    ang_r = (rows[:, None] * theta).unsqueeze(1).expand(h, w, k)
    ang_c = (cols[:, None] * theta).unsqueeze(0).expand(h, w, k)
    angles = torch.cat([ang_r, ang_c], dim=-1).reshape(h * w, 2 * k)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope_2d(x: Tensor, hw: Tuple[int, int], base: float = 10000.) -> Tensor:
    """Rotate features by their 2-D grid position.

    Computed in float32 for half-precision inputs (as the original), else in the input dtype;
    the result has the input dtype.

    Args:
        x (Tensor): (..., L, D) features with ``L == H * W`` in raster order, ``D % 4 == 0``.
        hw (tuple[int, int]): grid ``(H, W)``.
        base (float): frequency base. Defaults to 10000.

    Returns:
        Tensor: (..., L, D) rotated features.
    """
    h, w = (int(s) for s in hw)
    if x.shape[-2] != h * w:
        raise ValueError(f'RoPE: {x.shape[-2]} tokens do not match the grid {h}x{w}')
    work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    cos, sin = rope_2d_cos_sin((h, w), x.shape[-1], base, x.device, work)
    pairs = x.to(work).unflatten(-1, (-1, 2))
    re, im = pairs[..., 0], pairs[..., 1]
    out = torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1)
    return out.flatten(-2).to(x.dtype)
