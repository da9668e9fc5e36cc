"""RMSNorms: the blocks' plain RMSNorm (native CPU kernels), Mamba-2's gated RMSNorm
(``mamba_ssm``'s Triton kernel on CUDA) and the output side of a bidirectional mixer (our
Triton kernel on CUDA); their references are in :mod:`.reference.norm`."""
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cpu import native_cpu
from .cpu.rms_norm import rms_norm_native
from .cuda import _triton
from .reference.norm import bidir_gated_merge_ref, check_merge, gated_rms_norm_ref

__all__ = ['gated_rms_norm', 'rms_norm', 'RMSNorm', 'bidir_gated_merge']


def rms_norm(x: Tensor, weight: Tensor | None, eps: float | None = None) -> Tensor:
    """``F.rms_norm`` over the last dimension, in the native CPU kernels where they apply: a
    float32 / float64 CPU input with a weight of its dtype (or none), outside autocast and
    outside ``torch.compile`` tracing (the same result to rounding, tested)."""
    if (x.dtype in (torch.float32, torch.float64) and native_cpu.use_for(x)
            and x.numel() > 0 and (weight is None or weight.dtype == x.dtype)
            and not torch.is_autocast_enabled(x.device.type)):
        eps = torch.finfo(x.dtype).eps if eps is None else eps
        return rms_norm_native(x, weight, eps)
    return F.rms_norm(x, (x.shape[-1], ), weight, eps)


class RMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` over the last dimension (same parameters and state dict) that runs
    :func:`rms_norm`: on CPU in the native kernels, elsewhere ``F.rms_norm``."""

    def __init__(self, normalized_shape: int, eps: float | None = None,
                 elementwise_affine: bool = True, **kwargs):
        if not isinstance(normalized_shape, int):
            raise ValueError(f'RMSNorm: normalizes the last dimension only; normalized_shape '
                             f'must be an int, got {normalized_shape!r}')
        super().__init__(normalized_shape, eps, elementwise_affine, **kwargs)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1:] != self.normalized_shape:
            raise ValueError(f'RMSNorm: expected inputs of {self.normalized_shape[0]} channels '
                             f'(last dimension), got {tuple(x.shape)}')
        return rms_norm(x, self.weight, self.eps)


def gated_rms_norm(x: Tensor,
                   z: Tensor | None,
                   weight: Tensor,
                   eps: float = 1e-5,
                   group_size: int | None = None,
                   norm_before_gate: bool = False) -> Tensor:
    """RMSNorm over groups of channels, gated by ``silu(z)``
    (:func:`~mmdinomamba.ops.reference.gated_rms_norm_ref` says exactly what); on CUDA
    ``mamba_ssm``'s Triton kernel where available.

    Args:
        x (Tensor): (..., d) input.
        z (Tensor | None): (..., d) gate, or None.
        weight (Tensor): (d,) scale.
        eps (float): added to the mean square. Defaults to 1e-5.
        group_size (int, optional): channels per normalization group; must divide ``d``.
            Defaults to None (one group).
        norm_before_gate (bool): gate after the norm. Defaults to False.

    Returns:
        Tensor: (..., d) in the dtype of ``x``.
    """
    d = x.shape[-1]
    if d % (group_size or d) != 0 or weight.shape != (d, ):
        return gated_rms_norm_ref(x, z, weight, eps, group_size, norm_before_gate)  # raises
    if _triton.on_kernel_device(x) and (out := _triton.run_kernel(
            'norm', _triton.rmsnorm_fn, 'rmsnorm_fn', x, weight, None, z=z, eps=eps,
            group_size=group_size or d, norm_before_gate=norm_before_gate)) is not None:
        return out
    return gated_rms_norm_ref(x, z, weight, eps, group_size, norm_before_gate)


def bidir_gated_merge(y: Tensor, z: Tensor, weight: Tensor | None, eps: float = 1e-5,
                      group_size: int | None = None) -> Tensor:
    """Merge both scan directions of a bidirectional Mamba-2 mixer: un-flip the backward
    direction, gate and normalize each direction, average
    (:func:`~mmdinomamba.ops.reference.bidir_gated_merge_ref` says exactly what).

    On CUDA this is the op ``mmdinomamba::bidir_gated_merge``: one Triton kernel (forward and
    backward) that reads the backward direction at the flipped time index and writes the
    gradient straight into the scan's layout.

    Args:
        y (Tensor): (B, L, 2d) both directions' scan outputs (backward half flipped).
        z (Tensor): (B, L, d) gate, last dimension contiguous.
        weight (Tensor | None): (2, d) RMSNorm scales of both directions, or None (plain
            ``silu(z)`` gate).
        eps (float): added to the mean square. Defaults to 1e-5.
        group_size (int, optional): channels per normalization group. Defaults to None (one
            group).

    Returns:
        Tensor: (B, L, d) in the dtype of ``y``.
    """
    group_size = check_merge(y, z, weight, group_size)
    if _triton.on_kernel_device(y) and (op := _triton.kernel('bidir_merge')) is not None:
        return op(y, z, weight, eps, group_size)
    return bidir_gated_merge_ref(y, z, weight, eps, group_size)
