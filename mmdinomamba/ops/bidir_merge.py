"""The output side of a bidirectional Mamba mixer in one call: un-flip the backward direction,
gate and normalize each direction, average."""
from typing import Callable

import torch.nn.functional as F
from torch import Tensor

from . import _triton
from ._triton import bidir_merge_fn
from .norm import gated_rms_norm

__all__ = ['bidir_gated_merge']


def _check(y: Tensor, z: Tensor, weight: Tensor | None, group_size: int | None) -> int:
    d = z.shape[-1] if z.dim() == 3 else -1
    if (y.dim() != 3 or z.dim() != 3 or y.shape != (*z.shape[:2], 2 * d)
            or (weight is not None and tuple(weight.shape) != (2, d))):
        raise ValueError(f'bidir_gated_merge: need y (B, L, 2d), z (B, L, d) and weight (2, d) '
                         f'or None; got {tuple(y.shape)}, {tuple(z.shape)}, '
                         f'{None if weight is None else tuple(weight.shape)}')
    group_size = d if group_size is None else group_size
    if group_size < 1 or d % group_size:
        raise ValueError(f'bidir_gated_merge: group_size {group_size} must divide d={d}')
    return group_size


def bidir_gated_merge_portable(y: Tensor, z: Tensor, weight: Tensor | None, eps: float = 1e-5,
                               group_size: int | None = None) -> Tensor:
    """The specification of :func:`bidir_gated_merge` in plain PyTorch (slice, flip, two gated
    RMSNorms, average)."""
    d = z.shape[-1]
    y_f, y_b = y[..., :d], y[..., d:].flip(1)  # backward direction back to token order
    if weight is None:
        return (y_f + y_b) / 2 * F.silu(z)
    return (gated_rms_norm(y_f, z, weight[0], eps, group_size) +
            gated_rms_norm(y_b, z, weight[1], eps, group_size)) / 2


def bidir_gated_merge(y: Tensor,
                      z: Tensor,
                      weight: Tensor | None,
                      eps: float = 1e-5,
                      group_size: int | None = None,
                      *,
                      kernel: Callable | None = None) -> Tensor:
    """Merge both scan directions of a bidirectional Mamba-2 mixer.

    ``y`` holds the forward direction's outputs in channels ``[0, d)`` (token order) and the
    backward direction's in ``[d, 2d)`` (FLIPPED time order, as one scan of both directions
    returns them). With ``y_f = y[..., :d]`` and ``y_b = flip(y[..., d:])`` the result is::

        (rmsnorm(y_f * silu(z)) * weight[0] + rmsnorm(y_b * silu(z)) * weight[1]) / 2

    with the root mean square over groups of ``group_size`` channels, or, with
    ``weight=None``, ``(y_f + y_b) / 2 * silu(z)``. Half-precision inputs are computed in
    float32.

    On CUDA this is one Triton kernel (forward and backward) that reads the backward direction
    at the flipped time index and writes the gradient straight into the scan's layout: no flipped
    copy, no per-direction normalized outputs, no gradient concatenation. Elsewhere (or inside
    :func:`~mmdinomamba.ops.portable_ops`, or if the kernel fails) it is
    :func:`bidir_gated_merge_portable`, the specification.

    Args:
        y (Tensor): (B, L, 2d) both directions' scan outputs, last dimension contiguous.
        z (Tensor): (B, L, d) gate, last dimension contiguous (a split of a projection is fine).
        weight (Tensor | None): (2, d) RMSNorm scales of the forward and backward direction, or
            None for a plain ``silu(z)`` gate without normalization.
        eps (float): added to the mean square. Defaults to 1e-5.
        group_size (int, optional): channels per normalization group; must divide ``d``.
            Defaults to None (one group).
        kernel (Callable, optional): the fused kernel (``_triton.bidir_merge_fn()``) to run
            whatever the dispatch would choose now, e.g. in an activation checkpoint's
            recomputation, which must replay the forward pass's choice. Defaults to None
            (dispatch).

    Returns:
        Tensor: (B, L, d) in the dtype of ``y``.
    """
    group_size = _check(y, z, weight, group_size)
    if kernel is not None:
        return kernel(y, z, weight, float(eps), group_size)
    if _triton.on_kernel_device(y) and (out := _triton.run_kernel(
            'bidir_merge', bidir_merge_fn, 'fused bidirectional merge', y, z, weight, eps,
            group_size)) is not None:
        return out
    return bidir_gated_merge_portable(y, z, weight, eps, group_size)
